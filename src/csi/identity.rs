//! The CSI Identity service: the driver's name and version, its capabilities (none: a node plugin
//! with no controller), and readiness.

use bpfman_csi::v1 as csi;
use csi::identity_server::Identity;
use tonic::{Request, Response, Status};

/// The driver's name: the CSIDriver object's, as docs/kubernetes.md and deploy/kubernetes/ name it.
pub const DRIVER_NAME: &str = "stfs.csi.stfs.dev";

/// The Identity service.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        // No CONTROLLER_SERVICE: volumes need no provisioning or attaching, only a node's publish.
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        // Answering at all means the socket serves; the state directory was opened at start.
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
