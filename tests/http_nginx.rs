//! Remote sources against a real web server: nginx on loopback ports (plain HTTP and HTTPS with a
//! throwaway CA), checking byte-exact ranged reads, the version pin and TLS through the system store.
//! Skips with a message when nginx (or openssl, for the HTTPS half) is not installed, and fails under
//! `CI=true`.

#[path = "common/certs.rs"]
mod certs;
#[path = "common/nginx.rs"]
mod nginx;
#[path = "common/tools.rs"]
mod tools;

use std::sync::Arc;
use std::time::Duration;

use nginx::{find_program, Nginx};
use stfs::source::http::{HttpOptions, HttpSource, ProxySetting, RetryPolicy};
use stfs::source::Source;
use tools::tool_missing;

/// Deterministic test bytes.
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn options() -> HttpOptions {
    HttpOptions {
        proxy: ProxySetting::Direct,
        retry: RetryPolicy { attempts: 3, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) },
        read_timeout: Duration::from_secs(5),
        ..HttpOptions::default()
    }
}

/// Reads the whole object in 1 MiB blocks over three parallel streams and compares every byte.
fn check_byte_exact(source: &Arc<HttpSource>, data: &Arc<Vec<u8>>) {
    const BLOCK: u64 = 1 << 20;
    let blocks = source.len().div_ceil(BLOCK);
    let readers: Vec<_> = (0..3)
        .map(|reader| {
            let (source, data) = (Arc::clone(source), Arc::clone(data));
            std::thread::spawn(move || {
                let mut stream = source.open_reader().unwrap();
                for block in (reader..blocks).step_by(3) {
                    let offset = block * BLOCK;
                    let len = BLOCK.min(source.len() - offset) as usize;
                    let mut buf = vec![0; len];
                    stream.read_exact_at(&mut buf, offset).unwrap();
                    assert!(buf == data[offset as usize..offset as usize + len], "block {block} differs");
                }
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
}

#[test]
fn nginx_serves_byte_exact_ranges_over_http_and_https() {
    let certs = tempfile::tempdir().unwrap();
    let tls = find_program("openssl").is_some() && certs::make_certificates(certs.path(), "IP:127.0.0.1");
    let (cert, key) = (certs.path().join("leaf.pem"), certs.path().join("leaf.key"));
    let Some(nginx) = Nginx::start_with_tls(tls.then_some((cert.as_path(), key.as_path()))) else {
        return tool_missing("nginx", "apt-get install nginx");
    };
    let data = Arc::new(pattern((7 << 20) + 12_345));
    std::fs::write(nginx.root.join("model.safetensors"), data.as_slice()).unwrap();
    let http_port = nginx.port;

    let url = format!("http://127.0.0.1:{http_port}/model.safetensors");
    let source = Arc::new(HttpSource::open(&url, options()).unwrap());
    assert_eq!(source.len(), data.len() as u64);
    assert_eq!(source.header_prefix(), &data[..64 * 1024]);
    assert!(source.etag().is_some_and(|tag| !tag.starts_with("W/")), "nginx sends a strong ETag");
    check_byte_exact(&source, &data);

    if let Some(https_port) = nginx.https_port {
        // The system store is read through rustls-native-certs, which honours SSL_CERT_FILE. This is the
        // only test in this binary, so no other thread reads the environment meanwhile.
        std::env::set_var("SSL_CERT_FILE", certs.path().join("ca.pem"));
        let url = format!("https://127.0.0.1:{https_port}/model.safetensors");
        let secure = Arc::new(HttpSource::open(&url, options()).unwrap());
        assert_eq!(secure.etag(), source.etag());
        check_byte_exact(&secure, &data);
    } else {
        tool_missing("openssl (for the HTTPS half)", "apt-get install openssl");
    }

    // Replace the file (new size, hence new ETag): the pinned source must refuse, not mix versions.
    std::fs::write(nginx.root.join("model.safetensors"), pattern(1 << 20)).unwrap();
    let mut stream = source.open_reader().unwrap();
    let mut buf = vec![0; 4096];
    let error = stream.read_exact_at(&mut buf, 2 << 20).unwrap_err();
    assert!(error.to_string().contains("changed since mount"), "{error}");
}
