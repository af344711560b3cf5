//! Object stores by name: `s3://BUCKET/KEY` and `gs://BUCKET/OBJECT`, opened as an
//! [`HttpSource`] whose every ranged GET carries the store's credentials (a SigV4 signature, an
//! OAuth token), so an object store goes through the same engine, pinning and retries as a URL.
//!
//! - `names`: [`ObjectName`] parsing and key encoding;
//! - `s3`: endpoints, path-style and virtual-hosted addressing, region following, SigV4 signing;
//! - `aws`: the AWS credential chain (`aws-config`) and its refresh before expiry;
//! - `gcs`: the JSON API, generation pinning and Application Default Credentials (`gcp_auth`);
//! - `refresh`: expiring credentials fetched again off the read path, one fetch at a time, each
//!   bounded by `--timeout`.
//!
//! Credentials are fetched on one tokio runtime, off the read path; the mount opens its sources
//! after its fork, so nothing async crosses it.

mod aws;
mod gcs;
mod names;
mod refresh;
mod s3;

pub use names::{ObjectName, Store};

use std::sync::{Arc, OnceLock};

use crate::source::http::{HttpError, HttpOptions, HttpSource};

/// How to reach object stores (besides the HTTP settings every remote source shares).
#[derive(Clone, Debug, Default)]
pub struct ObjectOptions {
    /// `--endpoint-url`: an S3-compatible store (path-style addressing) or a GCS emulator.
    pub endpoint_url: Option<String>,
    /// `--no-sign-request`: anonymous requests (public buckets), no credential lookup.
    pub no_sign_request: bool,
    /// `--region`: the S3 bucket's region (else the AWS chain's, else followed from the store).
    pub region: Option<String>,
    /// The AWS settings and credentials, loaded once for every shard of a checkpoint.
    aws: Arc<OnceLock<Result<Arc<aws::AwsSession>, HttpError>>>,
    /// The Google credentials, loaded once for every shard of a checkpoint.
    gcs: Arc<OnceLock<Result<Arc<gcs::GcsAuth>, HttpError>>>,
}

/// Whether `spec` starts with an object store's scheme.
pub fn is_object_url(spec: &str) -> bool {
    spec.starts_with("s3://") || spec.starts_with("gs://")
}

/// Opens `s3://BUCKET/KEY` or `gs://BUCKET/OBJECT`, pinned (ETag, or the GCS generation).
pub fn open(spec: &str, http: &HttpOptions, options: &ObjectOptions) -> Result<HttpSource, HttpError> {
    let Some(name) = ObjectName::parse(spec) else {
        return Err(HttpError::BadOption("expected s3://BUCKET/KEY or gs://BUCKET/OBJECT".to_string()));
    };
    match name.store {
        Store::S3 => {
            let session = options.aws.get_or_init(|| {
                let (region, anonymous) = (options.region.as_deref(), options.no_sign_request);
                aws::AwsSession::load(&name.shown(), region, anonymous, http.timeout).map(Arc::new)
            });
            s3::open(
                &name,
                http,
                options.endpoint_url.as_deref(),
                options.region.as_deref(),
                Arc::clone(session.as_ref().map_err(HttpError::clone_message)?),
            )
        }
        Store::Gcs => {
            let auth = options.gcs.get_or_init(|| {
                let (endpoint, anonymous) = (options.endpoint_url.as_deref(), options.no_sign_request);
                gcs::GcsAuth::load(&name.shown(), endpoint, anonymous, http.timeout).map(Arc::new)
            });
            gcs::open(&name, http, Arc::clone(auth.as_ref().map_err(HttpError::clone_message)?))
        }
    }
}
