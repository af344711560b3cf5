//! The AWS side of `s3://`: settings (region, endpoint) and credentials from the standard chain of
//! `aws-config` (environment, shared config and credentials files with `AWS_PROFILE`, web identity,
//! ECS container credentials, EC2 instance metadata with IMDSv2), cached and fetched again before
//! they expire, so a mount outlives its temporary credentials.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;

use crate::source::http::HttpError;
use crate::util::lock;

/// Credentials are fetched again when they expire within this long.
const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Least time between two fetches while the chain keeps handing out credentials inside the margin
/// (instance metadata serves the old ones until it rotates them), unless they have expired.
const REFRESH_PAUSE: Duration = Duration::from_secs(10);

/// What the AWS chain said at open time, and the credentials it gave (none for unsigned requests).
pub(crate) struct AwsSession {
    /// The chain's region (`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's, instance metadata).
    pub region: Option<String>,
    /// The chain's endpoint (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's `endpoint_url`).
    pub endpoint_url: Option<String>,
    /// `None` with `--no-sign-request`.
    pub credentials: Option<CredentialCache>,
}

impl AwsSession {
    /// Runs the chain once (before the daemon forks): region, endpoint and first credentials.
    pub fn load(shown: &str, region: Option<&str>, no_sign_request: bool) -> Result<AwsSession, HttpError> {
        let auth_error = |detail: String| HttpError::Auth { name: shown.to_string(), detail };
        let loaded = block_on(async {
            let mut loader = aws_config::defaults(BehaviorVersion::latest());
            if let Some(region) = region {
                loader = loader.region(Region::new(region.to_string()));
            }
            if no_sign_request {
                loader = loader.no_credentials();
            }
            let config = loader.load().await;
            let region = config.region().map(|r| r.to_string());
            let endpoint =
                std::env::var("AWS_ENDPOINT_URL_S3").ok().or_else(|| config.endpoint_url().map(str::to_string));
            let credentials = match (no_sign_request, config.credentials_provider()) {
                (false, Some(provider)) => Some(provider.provide_credentials().await),
                _ => None,
            };
            (region, endpoint, credentials)
        })
        .map_err(|e| auth_error(format!("cannot start the credential lookup: {e}")))?;
        let (region, endpoint_url, first) = loaded;
        let credentials = match first {
            None if no_sign_request => None,
            None => return Err(auth_error(no_credentials_message())),
            Some(Err(error)) => return Err(auth_error(describe(&error))),
            Some(Ok(credentials)) => {
                Some(CredentialCache { region: region.clone(), current: Mutex::new((credentials, None)) })
            }
        };
        Ok(AwsSession { region, endpoint_url, credentials })
    }
}

/// The current credentials, fetched again from the chain shortly before they expire.
pub(crate) struct CredentialCache {
    region: Option<String>,
    /// The credentials and when they were last fetched again (none since the first fetch).
    current: Mutex<(Credentials, Option<Instant>)>,
}

impl CredentialCache {
    /// Credentials valid for at least a few more minutes (or the old ones, while still valid, if a
    /// refresh fails). The error holds no secret.
    pub fn get(&self) -> Result<Credentials, String> {
        let mut guard = lock(&self.current);
        let (current, last_fetch) = &mut *guard;
        let expires = current.expiry();
        let now = SystemTime::now();
        let paused = last_fetch.is_some_and(|at| at.elapsed() < REFRESH_PAUSE) && expires.is_some_and(|at| at > now);
        if expires.is_none_or(|at| at > now + REFRESH_BEFORE) || paused {
            return Ok(current.clone());
        }
        *last_fetch = Some(Instant::now());
        log::info!("AWS credentials expire soon; fetching them again");
        let region = self.region.clone();
        let fresh = block_on(async move {
            let mut chain = DefaultCredentialsChain::builder();
            if let Some(region) = region {
                chain = chain.region(Region::new(region));
            }
            chain.build().await.provide_credentials().await
        });
        match fresh {
            Ok(Ok(credentials)) => {
                *current = credentials;
                Ok(current.clone())
            }
            Ok(Err(error)) if expires.is_some_and(|at| at > now) => {
                log::warn!("refreshing AWS credentials failed, the current ones are still valid: {}", describe(&error));
                Ok(current.clone())
            }
            Ok(Err(error)) => Err(describe(&error)),
            Err(error) => Err(format!("cannot start the credential lookup: {error}")),
        }
    }
}

/// Runs `future` to completion on a current-thread runtime made for it and dropped after: the
/// chain's HTTP clients never outlive the runtime (nor cross the daemon's fork).
fn block_on<F: std::future::Future>(future: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let output = runtime.block_on(future);
    runtime.shutdown_background();
    Ok(output)
}

/// Which sources the chain tried, for "no credentials found".
fn no_credentials_message() -> String {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    format!(
        "no AWS credentials found (tried: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), \
         profile {profile} of the shared config and credentials files, web identity \
         (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), ECS container credentials, EC2 instance metadata); \
         for a public bucket use --no-sign-request"
    )
}

/// A credential error as one line, without secrets (the providers' messages name no key).
fn describe(error: &CredentialsError) -> String {
    match error {
        CredentialsError::CredentialsNotLoaded(_) => no_credentials_message(),
        other => {
            let mut text = format!("AWS credentials could not be loaded: {other}");
            let mut cause = std::error::Error::source(other);
            let mut io_error = false;
            while let Some(inner) = cause {
                io_error |= inner.downcast_ref::<std::io::Error>().is_some();
                // The SDK's errors repeat their cause's words ("service error: X: X"): once is enough.
                let words = inner.to_string();
                if !text.contains(&words) {
                    text.push_str(&format!(": {words}"));
                }
                cause = inner.source();
            }
            // The providers' file errors name no file: name the one the environment points at.
            if let Some(file) = unreadable_file().filter(|_| io_error) {
                text = format!("AWS credentials could not be loaded: {file}");
            }
            text.replace('\n', " ")
        }
    }
}

/// The first token file named by the environment that cannot be read, with why.
fn unreadable_file() -> Option<String> {
    ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"].into_iter().find_map(|var| {
        let path = std::env::var_os(var).filter(|p| !p.is_empty())?;
        let error = std::fs::File::open(&path).err()?;
        Some(format!("{} ({var}) cannot be read: {error}", std::path::Path::new(&path).display()))
    })
}

impl std::fmt::Debug for AwsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsSession")
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .field("signed", &self.credentials.is_some())
            .finish()
    }
}
