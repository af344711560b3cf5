//! A volume's publish secrets (`nodePublishSecretRef`): which keys are taken, the environment they
//! give the mount daemon, and the Google key file only the daemon's user can read. A value is never
//! shown: not by `Debug`, not in an error (errors name the key).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The keys that become the daemon's environment variables of the same name.
const ENVIRONMENT_KEYS: &[&str] = &["HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"];

/// The key holding a Google service-account key (the JSON document), written to a file.
const GOOGLE_KEY: &str = "GOOGLE_APPLICATION_CREDENTIALS_JSON";

/// The key file's name in the daemon's secret folder.
const GOOGLE_KEY_FILE: &str = "google-key.json";

/// The secrets of one publish, checked.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PublishSecrets {
    /// (variable, value) pairs for the daemon's environment, sorted by variable.
    environment: Vec<(&'static str, String)>,
    /// A Google service-account key.
    google_key: Option<String>,
}

impl fmt::Debug for PublishSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.environment.iter().map(|(k, _)| *k).collect();
        f.debug_struct("PublishSecrets").field("keys", &names).field("google_key", &self.google_key.is_some()).finish()
    }
}

/// A secret key stfs does not take (its value is not shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownSecretKey(pub String);

impl fmt::Display for UnknownSecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown key `{}` in the volume's secret (stfs takes {} and {GOOGLE_KEY})",
            self.0,
            ENVIRONMENT_KEYS.join(", ")
        )
    }
}

impl std::error::Error for UnknownSecretKey {}

impl PublishSecrets {
    /// Checks the keys of `secrets`; an empty value counts as absent.
    pub fn parse(secrets: &HashMap<String, String>) -> Result<PublishSecrets, UnknownSecretKey> {
        let mut parsed = PublishSecrets::default();
        let mut keys: Vec<&String> = secrets.keys().collect();
        keys.sort();
        for key in keys {
            let value = &secrets[key];
            if let Some(&variable) = ENVIRONMENT_KEYS.iter().find(|&&k| k == key) {
                if !value.is_empty() {
                    parsed.environment.push((variable, value.clone()));
                }
            } else if key == GOOGLE_KEY {
                parsed.google_key = Some(value.clone()).filter(|v| !v.is_empty());
            } else {
                return Err(UnknownSecretKey(key.clone()));
            }
        }
        Ok(parsed)
    }

    /// Feeds every key and value into `digest`, so that volumes with other credentials never
    /// share a mount (a pod must not read through another pod's token).
    pub fn digest_into(&self, digest: &mut ring::digest::Context) {
        for (key, value) in &self.environment {
            for part in [key.as_bytes(), b"\0", value.as_bytes(), b"\0"] {
                digest.update(part);
            }
        }
        if let Some(key) = &self.google_key {
            for part in [GOOGLE_KEY.as_bytes(), b"\0", key.as_bytes(), b"\0"] {
                digest.update(part);
            }
        }
    }

    /// The daemon's environment: the secrets' variables, and with a Google key, written into
    /// `folder` (which only the daemon's user may enter), `GOOGLE_APPLICATION_CREDENTIALS`.
    pub fn environment(&self, folder: &Path, owner: (u32, u32)) -> std::io::Result<Vec<(String, String)>> {
        let mut environment: Vec<(String, String)> =
            self.environment.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        if let Some(key) = &self.google_key {
            let path = write_private_file(&folder.join(GOOGLE_KEY_FILE), key.as_bytes(), owner)?;
            environment.push(("GOOGLE_APPLICATION_CREDENTIALS".to_string(), path.display().to_string()));
        }
        Ok(environment)
    }
}

/// Writes `bytes` to a new file at `path`, created exclusively (a file there from an earlier
/// mount removed first) and never through a link, mode 0400, owned by `owner` (uid, gid).
fn write_private_file(path: &Path, bytes: &[u8], owner: (u32, u32)) -> std::io::Result<PathBuf> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    std::os::unix::fs::fchown(&file, Some(owner.0), Some(owner.1))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner of `path` (this test's user, for a folder it made).
    fn owner_of(path: &Path) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn keys_become_variables_and_values_are_never_shown() {
        let parsed = PublishSecrets::parse(&secrets(&[("HF_TOKEN", "hf_secret"), ("AWS_SESSION_TOKEN", "")])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = owner_of(dir.path());
        assert_eq!(parsed.environment(dir.path(), (uid, gid)).unwrap(), [("HF_TOKEN".into(), "hf_secret".into())]);
        assert!(!format!("{parsed:?}").contains("hf_secret"));
        let refused = PublishSecrets::parse(&secrets(&[("password", "hunter2")])).unwrap_err().to_string();
        assert!(refused.contains("`password`") && !refused.contains("hunter2"), "{refused}");
    }

    #[test]
    fn a_google_key_goes_to_a_private_file_created_exclusively() {
        use std::os::unix::fs::MetadataExt;
        let parsed = PublishSecrets::parse(&secrets(&[(GOOGLE_KEY, "{\"type\":\"service_account\"}")])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let owner = owner_of(dir.path());
        let environment = parsed.environment(dir.path(), owner).unwrap();
        let path = dir.path().join(GOOGLE_KEY_FILE);
        assert_eq!(environment, [("GOOGLE_APPLICATION_CREDENTIALS".into(), path.display().to_string())]);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o400);
        // A link planted there is replaced, never followed.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        parsed.environment(dir.path(), owner).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    }

    #[test]
    fn other_credentials_give_another_digest() {
        let digest = |token: &str| {
            let mut context = ring::digest::Context::new(&ring::digest::SHA256);
            PublishSecrets::parse(&secrets(&[("HF_TOKEN", token)])).unwrap().digest_into(&mut context);
            context.finish().as_ref().to_vec()
        };
        assert_ne!(digest("a"), digest("b"));
        assert_eq!(digest("a"), digest("a"));
    }
}
