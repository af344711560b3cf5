//! The S3 server of `scripts/bench/s3.py`: `s3s-fs`'s store behind `s3s`'s SigV4 checks, with one
//! change on the read path. The `s3s-fs` binary streams a GET's body from a tokio file 4 KiB at a
//! time, a blocking-pool hand-off and a socket write per 4 KiB: on the 2-vCPU bench machine that
//! caps every client at ~240 MiB/s over all connections together while the server burns 1.5 CPUs,
//! far below what 8 connections paced at 100 MiB/s (the store the bench models) carry. Here the
//! body is the same bytes of the same file read 1 MiB at a time; headers, ETags, errors,
//! listings and uploads are s3s-fs's own.
//!
//! `stfs-bench-s3server --port PORT --access-key KEY --secret-key SECRET ROOT`

use std::path::PathBuf;

use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

/// Bytes read from the file per piece of a GET's body.
const PIECE: usize = 1 << 20;

struct Store {
    fs: FileSystem,
    root: PathBuf,
}

/// The S3 implementation: each named operation goes to s3s-fs unchanged, GET to [`Store::get`].
/// (One macro makes the whole impl, so `async_trait` sees the expanded methods.)
macro_rules! delegate {
    ($($op:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for Store {
            $(async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                self.fs.$op(req).await
            })*

            async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
                self.get(req).await
            }
        }
    };
}

delegate! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    put_object: PutObjectInput => PutObjectOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}

impl Store {
    /// s3s-fs's answer (status, headers, ETag, errors), its body replaced by the same bytes read
    /// in [`PIECE`]s.
    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let path = self.root.join(&req.input.bucket).join(&req.input.key);
        let range = req.input.range;
        let mut response = self.fs.get_object(req).await?;
        let length = response.output.content_length.unwrap_or(0) as u64;
        let file = std::fs::File::open(&path).map_err(|e| s3s::s3_error!(e, InternalError))?;
        let size = file.metadata().map_err(|e| s3s::s3_error!(e, InternalError))?.len();
        let start = match range {
            Some(Range::Int { first, .. }) => first,
            Some(Range::Suffix { length: suffix }) => size.saturating_sub(suffix),
            None => 0,
        };
        let body = pieces(Arc::new(file), start, start + length);
        response.output.body = Some(StreamingBlob::wrap(body));
        Ok(response)
    }
}

/// Bytes `start..end` of `file`, one `pread` of up to [`PIECE`] bytes on the blocking pool per
/// piece, straight into the piece's buffer (tokio's `File` would read into its own buffer and copy).
fn pieces(file: Arc<std::fs::File>, start: u64, end: u64) -> impl futures::Stream<Item = std::io::Result<Bytes>> {
    futures::stream::try_unfold(start, move |at| {
        let file = Arc::clone(&file);
        async move {
            if at >= end {
                return Ok(None);
            }
            let len = (end - at).min(PIECE as u64) as usize;
            let piece = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, at).map(|()| Bytes::from(buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(Some((piece, at + len as u64)))
        }
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut port, mut key, mut secret, mut root) = (0u16, None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = args.next().and_then(|p| p.parse().ok()).expect("--port PORT"),
            "--access-key" => key = args.next(),
            "--secret-key" => secret = args.next(),
            _ => root = Some(PathBuf::from(arg)),
        }
    }
    let root = root.expect("usage: stfs-bench-s3server --port P --access-key K --secret-key S ROOT");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(serve(port, key, secret, root));
}

async fn serve(port: u16, key: Option<String>, secret: Option<String>, root: PathBuf) {
    let fs = FileSystem::new(&root).expect("the store's root directory");
    let mut builder = S3ServiceBuilder::new(Store { fs, root });
    if let (Some(key), Some(secret)) = (key, secret) {
        builder.set_auth(SimpleAuth::from_single(key, secret));
    }
    let service = builder.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("the port");
    let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    loop {
        let Ok((socket, _)) = listener.accept().await else { continue };
        let _ = socket.set_nodelay(true);
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(socket), service.clone()).into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
