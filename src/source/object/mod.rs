//! Object stores by name: `s3://BUCKET/KEY` and `gs://BUCKET/OBJECT`, opened as an
//! [`HttpSource`] whose every ranged GET carries the store's credentials (a SigV4 signature, an
//! OAuth token), so an object store goes through the same engine, pinning and retries as a URL.
//!
//! - `names`: [`ObjectName`] parsing and key encoding;
//! - `s3`: endpoints, path-style and virtual-hosted addressing, region following, SigV4 signing;
//! - `aws`: the AWS credential chain (`aws-config`) and its refresh before expiry;
//! - `gcs`: the JSON API, generation pinning and Application Default Credentials (`gcp_auth`);
//! - `list`: a prefix (`s3://BUCKET/PREFIX/`) listed once, its objects opened at the versions listed;
//! - `refresh`: expiring credentials fetched again off the read path, one fetch at a time, each
//!   bounded by `--timeout`.
//!
//! Credentials are fetched on one tokio runtime, off the read path; the mount opens its sources
//! after its fork, so nothing async crosses it.

mod aws;
mod gcs;
mod list;
mod names;
mod refresh;
mod s3;

pub use gcs::NO_AMBIENT_CREDENTIALS;
pub use list::{ListLimits, Listed, Listing};
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

/// Whether `spec` names a prefix of an object store: `s3://BUCKET/PREFIX/`, `gs://BUCKET/`.
pub fn is_object_prefix(spec: &str) -> bool {
    ObjectName::parse_prefix(spec).is_some()
}

/// Opens `s3://BUCKET/KEY` or `gs://BUCKET/OBJECT`, pinned (ETag, or the GCS generation).
pub fn open(spec: &str, http: &HttpOptions, options: &ObjectOptions) -> Result<HttpSource, HttpError> {
    let Some(name) = ObjectName::parse(spec) else {
        return Err(HttpError::BadOption("expected s3://BUCKET/KEY or gs://BUCKET/OBJECT".to_string()));
    };
    match name.store {
        Store::S3 => {
            let session = aws_session(&name, http, options)?;
            s3::open(&name, http, options.endpoint_url.as_deref(), options.region.as_deref(), session)
        }
        Store::Gcs => gcs::open(&name, http, gcs_auth(&name, http, options)?),
    }
}

/// Lists `s3://BUCKET/PREFIX/` or `gs://BUCKET/PREFIX/` once, within `http`'s deadline and
/// `limits`; [`Listing::open`] then opens each object at the version listed.
pub fn list(spec: &str, http: &HttpOptions, options: &ObjectOptions, limits: ListLimits) -> Result<Listing, HttpError> {
    let Some(prefix) = ObjectName::parse_prefix(spec) else {
        return Err(HttpError::BadOption("expected s3://BUCKET/PREFIX/ or gs://BUCKET/PREFIX/".to_string()));
    };
    let access = match prefix.store {
        Store::S3 => {
            let session = aws_session(&prefix, http, options)?;
            let endpoint = s3::endpoint(options.endpoint_url.as_deref(), &session);
            list::Access::S3 { session, endpoint, region: options.region.clone() }
        }
        Store::Gcs => list::Access::Gcs { auth: gcs_auth(&prefix, http, options)? },
    };
    Listing::list(&prefix, access, http, limits)
}

/// The AWS settings and credentials, loaded at the first object of the checkpoint.
fn aws_session(
    name: &ObjectName,
    http: &HttpOptions,
    options: &ObjectOptions,
) -> Result<Arc<aws::AwsSession>, HttpError> {
    let session = options.aws.get_or_init(|| {
        let (region, anonymous) = (options.region.as_deref(), options.no_sign_request);
        aws::AwsSession::load(&name.shown(), region, anonymous, http.timeout).map(Arc::new)
    });
    Ok(Arc::clone(session.as_ref().map_err(HttpError::clone_message)?))
}

/// The Google credentials, loaded at the first object of the checkpoint.
fn gcs_auth(name: &ObjectName, http: &HttpOptions, options: &ObjectOptions) -> Result<Arc<gcs::GcsAuth>, HttpError> {
    let auth = options.gcs.get_or_init(|| {
        let (endpoint, anonymous) = (options.endpoint_url.as_deref(), options.no_sign_request);
        gcs::GcsAuth::load(&name.shown(), endpoint, anonymous, http.timeout).map(Arc::new)
    });
    Ok(Arc::clone(auth.as_ref().map_err(HttpError::clone_message)?))
}
