//! The plugin's gRPC server: the endpoint (`unix:///PATH`) bound, a stale socket from an earlier
//! run replaced, and the Identity and Node services served by tonic until the process is killed.
//! The mount daemons are not its children to wait for: killing the plugin leaves them serving.

use std::fmt;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bpfman_csi::v1::identity_server::IdentityServer;
use bpfman_csi::v1::node_server::NodeServer;

use crate::csi::identity::IdentityService;
use crate::csi::node::NodeService;
use crate::csi::volumes::Volumes;

/// Threads answering requests; publishes run on tokio's blocking threads besides.
const WORKER_THREADS: usize = 2;

/// Why the plugin could not serve.
#[derive(Debug)]
pub enum ServerError {
    /// The endpoint is not `unix:///PATH`.
    Endpoint(String),
    /// Something else than a socket is at the endpoint's path.
    NotASocket(PathBuf),
    /// A step failed.
    Io {
        /// What, and where.
        doing: String,
        /// Why.
        error: io::Error,
    },
    /// The gRPC server stopped.
    Transport(tonic::transport::Error),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Endpoint(text) => {
                write!(f, "endpoint `{text}`: expected unix:///PATH (an absolute socket path)")
            }
            ServerError::NotASocket(path) => {
                write!(f, "{}: exists and is not a socket; not replacing it", path.display())
            }
            ServerError::Io { doing, error } => write!(f, "{doing}: {}", crate::util::describe_io(error)),
            ServerError::Transport(e) => write!(f, "gRPC server: {e}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// The socket path of an endpoint written `unix:///PATH` (or `unix:/PATH`).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, ServerError> {
    let path = endpoint.strip_prefix("unix://").or_else(|| endpoint.strip_prefix("unix:"));
    match path.map(Path::new) {
        Some(path) if path.is_absolute() => Ok(path.to_path_buf()),
        _ => Err(ServerError::Endpoint(endpoint.to_string())),
    }
}

/// Removes a socket left at `path` by an earlier run (nothing else is removed).
fn clear_stale_socket(path: &Path) -> Result<(), ServerError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|error| ServerError::Io { doing: format!("removing the old socket {}", path.display()), error }),
        Ok(_) => Err(ServerError::NotASocket(path.to_path_buf())),
        Err(_) => Ok(()),
    }
}

/// Serves the Identity and Node services on `socket` until the process ends.
pub fn serve(socket: &Path, node_id: String, volumes: Volumes) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name("stfs-csi")
        .enable_all()
        .build()
        .map_err(|error| ServerError::Io { doing: "starting the gRPC runtime".into(), error })?;
    clear_stale_socket(socket)?;
    let node = NodeService { node_id, volumes: Arc::new(volumes) };
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(socket)
            .map_err(|error| ServerError::Io { doing: format!("listening on {}", socket.display()), error })?;
        log::info!("serving CSI on {}", socket.display());
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(IdentityService))
            .add_service(NodeServer::new(node))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .map_err(ServerError::Transport)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_socket_paths() {
        assert_eq!(socket_path("unix:///csi/csi.sock").unwrap(), Path::new("/csi/csi.sock"));
        assert_eq!(socket_path("unix:/csi/csi.sock").unwrap(), Path::new("/csi/csi.sock"));
        for bad in ["tcp://127.0.0.1:10000", "unix://relative", "/csi/csi.sock"] {
            assert!(socket_path(bad).unwrap_err().to_string().contains("unix:///PATH"), "{bad}");
        }
    }
}
