//! Every ureq agent of stfs, configured in one place from [`HttpOptions`]: the proxy, the trusted
//! roots (`AWS_CA_BUNDLE`, else the platform's), the timeouts, no redirect followed by the client
//! (callers follow them by hand, credentials kept to their origin), statuses as answers.

use std::time::Duration;

use ureq::config::Config;
use ureq::Agent;

use super::error::HttpError;
use super::options::{HttpOptions, ProxySetting};
use super::url::display_name;

/// Longest CA bundle read (the system's whole bundle is about 200 KiB).
const MAX_CA_BUNDLE_BYTES: u64 = 16 << 20;

/// The configuration of every agent made for `options`; `global`, when set, bounds each whole
/// exchange, body included (a request may bound it further with `timeout_global`).
pub(crate) fn agent_config(options: &HttpOptions, global: Option<Duration>) -> Result<Config, HttpError> {
    let proxy = match &options.proxy {
        ProxySetting::FromEnvironment => ureq::Proxy::try_from_env(),
        ProxySetting::Direct => None,
        ProxySetting::Url(url) => Some(
            ureq::Proxy::new(url.expose())
                .map_err(|_| HttpError::BadOption(format!("invalid proxy URL {}", display_name(url.expose()))))?,
        ),
    };
    let roots = match &options.ca_bundle {
        None => ureq::tls::RootCerts::PlatformVerifier,
        Some(path) => load_ca_bundle(path)?,
    };
    Ok(Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .user_agent(concat!("stfs/", env!("CARGO_PKG_VERSION")))
        .proxy(proxy)
        .timeout_connect(Some(options.connect_timeout))
        .timeout_per_read(Some(options.read_timeout))
        .timeout_per_call(Some(options.request_timeout))
        .timeout_global(global)
        .tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build())
        .build())
}

/// An agent of its own (its own connection pool) for `options`, see [`agent_config`].
pub(crate) fn new_agent(options: &HttpOptions, global: Option<Duration>) -> Result<Agent, HttpError> {
    agent_config(options, global).map(Agent::new_with_config)
}

/// Root certificates from a PEM file (`AWS_CA_BUNDLE`), instead of the platform's.
fn load_ca_bundle(path: &std::path::Path) -> Result<ureq::tls::RootCerts, HttpError> {
    let shown = path.display();
    let pem = crate::source::read_regular(path, MAX_CA_BUNDLE_BYTES)
        .map_err(|e| HttpError::BadOption(format!("CA bundle {shown}: {}", crate::util::describe_io(&e))))?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(HttpError::BadOption(format!("CA bundle {shown} holds no PEM certificate")));
    }
    Ok(ureq::tls::RootCerts::new_with_certs(&certs))
}
