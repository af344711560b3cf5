//! Throwaway TLS certificates made with openssl: a CA and one server certificate it signed.

#![allow(dead_code)] // shared by several test binaries, each using part of it

use std::path::Path;
use std::process::{Command, Stdio};

/// Makes, in `dir`, a CA (`ca.pem`) and a leaf certificate (`leaf.pem`, key `leaf.key`) for the
/// subject alternative name `san` (`IP:127.0.0.1`, `DNS:accounts.google.com`) signed by it;
/// false if openssl fails.
pub fn make_certificates(dir: &Path, san: &str) -> bool {
    let ext = dir.join("leaf.ext");
    let extensions = format!(
        "subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    );
    std::fs::write(&ext, extensions).unwrap();
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=stfs test CA",
        ],
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=stfs test server",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
        ],
    ];
    steps.iter().all(|args| {
        Command::new("openssl")
            .args(*args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}
