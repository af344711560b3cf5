//! The AWS side of `s3://`: settings (region, endpoint) and credentials from the standard chain of
//! `aws-config` (environment, shared config and credentials files with `AWS_PROFILE`, web identity,
//! ECS container credentials, EC2 instance metadata with IMDSv2), cached and fetched again before
//! they expire (off the read path, `refresh`), so a mount outlives its temporary credentials.

use std::time::{Duration, SystemTime};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;
use aws_smithy_runtime::client::defaults::default_http_client_plugin_v2;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector};
use aws_smithy_runtime_api::client::runtime_components::{RuntimeComponents, RuntimeComponentsBuilder};
use aws_smithy_runtime_api::client::runtime_plugin::RuntimePlugin;

use super::refresh::{lookup, Expiring, Refreshing};
use crate::source::http::HttpError;

/// What the AWS chain said at open time, and the credentials it gave (none for unsigned requests).
pub(crate) struct AwsSession {
    /// The chain's region (`AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's, instance metadata).
    pub region: Option<String>,
    /// The chain's endpoint (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's `endpoint_url`).
    pub endpoint_url: Option<String>,
    /// `None` with `--no-sign-request`.
    pub credentials: Option<CredentialCache>,
}

/// The current credentials, fetched again from the chain shortly before they expire (off the
/// read path, see [`Refreshing`]).
pub(crate) type CredentialCache = Refreshing<Credentials>;

impl Expiring for Credentials {
    fn expires(&self) -> Option<SystemTime> {
        self.expiry()
    }
}

impl AwsSession {
    /// Runs the chain once (as the mount opens its sources): region, endpoint and first credentials, all
    /// within `timeout` (`--timeout`), which also bounds each later fetch of credentials.
    pub fn load(
        shown: &str,
        region: Option<&str>,
        no_sign_request: bool,
        timeout: Duration,
    ) -> Result<AwsSession, HttpError> {
        let auth_error = |detail: String| HttpError::Auth { name: shown.to_string(), detail };
        let region_asked = region.map(str::to_string);
        let loaded = lookup(timeout, async move {
            let mut loader = aws_config::defaults(BehaviorVersion::latest());
            if let Some(client) = deferred_default_client() {
                loader = loader.http_client(client);
            }
            if let Some(region) = region_asked {
                loader = loader.region(Region::new(region));
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
        .map_err(auth_error)?;
        let (region, endpoint_url, first) = loaded;
        let credentials = match first {
            None if no_sign_request => None,
            None => return Err(auth_error(no_credentials_message())),
            Some(Err(error)) => return Err(auth_error(describe(&error))),
            Some(Ok(credentials)) => {
                Some(Refreshing::new("AWS credentials", credentials, timeout, fetch(region.clone())))
            }
        };
        Ok(AwsSession { region, endpoint_url, credentials })
    }
}

/// The SDK's default HTTPS client, whose TLS roots (the system's certificates: every file of
/// `/etc/ssl/certs` read and parsed) load when a provider of the chain first sends a request, not
/// when the chain is built: the SDK loads them then on purpose (`validate_base_client_config`),
/// about 5 ms of every `s3://` mount, though keys from the environment or a profile file need no
/// request at all. `None` if the SDK has no default client (it then uses none either).
fn deferred_default_client() -> Option<Deferred> {
    let plugin = default_http_client_plugin_v2(BehaviorVersion::latest())?;
    let client = plugin.runtime_components(&RuntimeComponentsBuilder::new("stfs")).http_client()?;
    Some(Deferred(client))
}

/// An HTTP client that is `.0` except that it checks nothing when a configuration is built
/// (`HttpClient::validate_base_client_config` keeps its default), so nothing is loaded until a
/// connector is asked for.
#[derive(Debug)]
struct Deferred(SharedHttpClient);

impl HttpClient for Deferred {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// Fetches credentials from the chain again (in `region`, as at open time).
fn fetch(region: Option<String>) -> super::refresh::Fetch<Credentials> {
    Box::new(move |timeout| {
        let region = region.clone();
        let fresh = lookup(timeout, async move {
            let mut chain = DefaultCredentialsChain::builder();
            if let Some(region) = region {
                chain = chain.region(Region::new(region));
            }
            chain.build().await.provide_credentials().await
        })?;
        fresh.map_err(|error| describe(&error))
    })
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
        // Opened without blocking: a FIFO there must not hold the mount.
        let error = crate::source::open_regular(std::path::Path::new(&path)).err()?;
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
