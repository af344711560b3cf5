//! Remote sources against a real web server: nginx on loopback ports (plain HTTP and HTTPS with a
//! throwaway CA), checking byte-exact ranged reads, the version pin and TLS through the system store.
//! Skips with a message when nginx (or openssl, for the HTTPS half) is not installed.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stfs::http::{HttpOptions, HttpSource, ProxySetting, RetryPolicy};
use stfs::source::Source;

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

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The nginx child process; killed when the test ends, pass or fail.
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes a CA and a leaf certificate for 127.0.0.1 signed by it; returns false if openssl fails.
fn make_certificates(dir: &Path) -> bool {
    let ext = dir.join("leaf.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
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
            "/CN=127.0.0.1",
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

fn options() -> HttpOptions {
    HttpOptions {
        proxy: ProxySetting::Direct,
        retry: RetryPolicy {
            attempts: 3,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
        },
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
                let mut stream = source.open_stream().unwrap();
                for block in (reader..blocks).step_by(3) {
                    let offset = block * BLOCK;
                    let len = BLOCK.min(source.len() - offset) as usize;
                    let mut buf = vec![0; len];
                    stream.read_exact_at(&mut buf, offset).unwrap();
                    assert!(
                        buf == data[offset as usize..offset as usize + len],
                        "block {block} differs"
                    );
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
    let Some(nginx) = find_program("nginx") else {
        println!("skipping: nginx is not installed (apt-get install nginx-light)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let data = Arc::new(pattern((7 << 20) + 12_345));
    std::fs::write(www.join("model.safetensors"), data.as_slice()).unwrap();
    let tls = find_program("openssl").is_some() && make_certificates(dir.path());
    let (http_port, https_port) = (free_port(), free_port());
    let d = dir.path().display();
    let tls_server = if tls {
        format!(
            "server {{ listen 127.0.0.1:{https_port} ssl; ssl_certificate {d}/leaf.pem; \
             ssl_certificate_key {d}/leaf.key; root {d}/www; }}"
        )
    } else {
        String::new()
    };
    let config = format!(
        "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log warn;
         events {{ worker_connections 64; }}
         http {{ access_log off; client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
                fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
                server {{ listen 127.0.0.1:{http_port}; root {d}/www; }}
                {tls_server} }}"
    );
    std::fs::write(dir.path().join("nginx.conf"), config).unwrap();
    let child = Command::new(nginx)
        .args(["-e", "stderr", "-p"])
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start nginx");
    let _nginx = Nginx(child);
    wait_for_port(http_port);

    let url = format!("http://127.0.0.1:{http_port}/model.safetensors");
    let source = Arc::new(HttpSource::open(&url, options()).unwrap());
    assert_eq!(source.len(), data.len() as u64);
    assert_eq!(source.header_prefix(), &data[..64 * 1024]);
    assert!(
        source.etag().is_some_and(|tag| !tag.starts_with("W/")),
        "nginx sends a strong ETag"
    );
    check_byte_exact(&source, &data);

    if tls {
        wait_for_port(https_port);
        // The system store is read through rustls-native-certs, which honours SSL_CERT_FILE. This is the
        // only test in this binary, so no other thread reads the environment meanwhile.
        std::env::set_var("SSL_CERT_FILE", dir.path().join("ca.pem"));
        let url = format!("https://127.0.0.1:{https_port}/model.safetensors");
        let secure = Arc::new(HttpSource::open(&url, options()).unwrap());
        assert_eq!(secure.etag(), source.etag());
        check_byte_exact(&secure, &data);
    } else {
        println!("skipping the HTTPS half: openssl could not make a test certificate");
    }

    // Replace the file (new size, hence new ETag): the pinned source must refuse, not mix versions.
    std::fs::write(www.join("model.safetensors"), pattern(1 << 20)).unwrap();
    let mut stream = source.open_stream().unwrap();
    let mut buf = vec![0; 4096];
    let error = stream.read_exact_at(&mut buf, 2 << 20).unwrap_err();
    assert!(error.to_string().contains("changed since mount"), "{error}");
}
