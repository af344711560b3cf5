//! The CSI Node service: each request checked as the spec says (a missing field or an unsupported
//! capability is INVALID_ARGUMENT), then handed to [`Volumes`] on a blocking thread. Replies never
//! carry a secret: errors name keys and attributes, never values.
// tonic's generated `Node` trait answers `tonic::Status` by value; the helpers here pass it on.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bpfman_csi::v1 as csi;
use csi::node_server::Node;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::AccessType;
use tonic::{Request, Response, Status};

use crate::csi::attributes;
use crate::csi::secrets::PublishSecrets;
use crate::csi::volumes::{VolumeError, Volumes};

/// The Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    /// This node's name.
    pub node_id: String,
    /// What publishes.
    pub volumes: Arc<Volumes>,
}

/// The access modes of a volume nothing writes to.
const READER_MODES: &[Mode] = &[Mode::SingleNodeReaderOnly, Mode::MultiNodeReaderOnly];

/// Checks a request's volume capability: a mount (not a block device) in a reader mode, or in a
/// writer mode published read-only (kubelet asks SINGLE_NODE_WRITER for every inline volume).
/// Returns the pod's fsGroup (`volume_mount_group`, empty if none).
fn check_capability(capability: Option<&csi::VolumeCapability>, readonly: bool) -> Result<String, Status> {
    let capability = capability.ok_or_else(|| Status::invalid_argument("volume capability missing"))?;
    let mount = match &capability.access_type {
        Some(AccessType::Mount(mount)) => mount,
        Some(AccessType::Block(_)) => {
            return Err(Status::invalid_argument("block volumes are not supported: stfs volumes are mounted folders"))
        }
        None => return Err(Status::invalid_argument("volume capability has no access type")),
    };
    let mode = capability.access_mode.as_ref().map(|m| m.mode).and_then(|m| Mode::try_from(m).ok());
    match mode {
        None | Some(Mode::Unknown) => Err(Status::invalid_argument("volume capability has no access mode")),
        Some(m) if READER_MODES.contains(&m) || readonly => Ok(mount.volume_mount_group.clone()),
        Some(m) => Err(Status::invalid_argument(format!(
            "access mode {} is writable and the volume is not published read-only; stfs volumes are \
             read-only (set readOnly: true)",
            m.as_str_name()
        ))),
    }
}

/// A required, absolute path field.
fn required_path(text: &str, field: &str) -> Result<PathBuf, Status> {
    if text.is_empty() {
        return Err(Status::invalid_argument(format!("{field} missing")));
    }
    let path = Path::new(text);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!("{field} `{text}` is not an absolute path")));
    }
    Ok(path.to_path_buf())
}

/// A [`VolumeError`] as the spec's status.
fn status_of(error: VolumeError) -> Status {
    match error {
        VolumeError::Incompatible { .. } => Status::already_exists(error.to_string()),
        VolumeError::LinkedTarget { .. } => Status::invalid_argument(error.to_string()),
        _ => Status::internal(error.to_string()),
    }
}

/// Runs `work` on a blocking thread (it locks, mounts and waits for daemons).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, Status> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Status::internal(format!("request task: {e}")))?
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        _: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("stfs does not stage volumes (no STAGE_UNSTAGE_VOLUME capability)"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("stfs does not stage volumes (no STAGE_UNSTAGE_VOLUME capability)"))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume id missing"));
        }
        let target = required_path(&request.target_path, "target path")?;
        let mount_group = check_capability(request.volume_capability.as_ref(), request.readonly)?;
        let volumes = self.volumes.clone();
        let spec = attributes::parse(&request.volume_context, &mount_group, volumes.cache_dir.is_some())
            .map_err(|e| Status::invalid_argument(format!("volume {}: {e}", request.volume_id)))?;
        let secrets = PublishSecrets::parse(&request.secrets)
            .map_err(|e| Status::invalid_argument(format!("volume {}: {e}", request.volume_id)))?;
        blocking(move || volumes.publish(&target, &spec, &secrets).map_err(status_of)).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume id missing"));
        }
        let target = required_path(&request.target_path, "target path")?;
        let volumes = self.volumes.clone();
        blocking(move || volumes.unpublish(&target).map_err(status_of)).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("stfs reports no volume stats (no GET_VOLUME_STATS capability)"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("stfs volumes are read-only and cannot be expanded"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{rpc::Type, Rpc, Type as Kind};
        // VOLUME_MOUNT_GROUP: kubelet passes the pod's fsGroup, the files' group.
        let capability =
            csi::NodeServiceCapability { r#type: Some(Kind::Rpc(Rpc { r#type: Type::VolumeMountGroup as i32 })) };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities: vec![capability] }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse { node_id: self.node_id.clone(), ..Default::default() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn capability(mode: Mode, block: bool) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume { volume_mount_group: "2000".into(), ..Default::default() })
            }),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn readers_pass_writers_only_read_only_and_blocks_never() {
        assert_eq!(check_capability(Some(&capability(Mode::SingleNodeReaderOnly, false)), false).unwrap(), "2000");
        assert_eq!(check_capability(Some(&capability(Mode::SingleNodeWriter, false)), true).unwrap(), "2000");
        for (capability, readonly) in [
            (Some(capability(Mode::SingleNodeWriter, false)), false),
            (Some(capability(Mode::MultiNodeMultiWriter, false)), false),
            (Some(capability(Mode::SingleNodeReaderOnly, true)), true),
            (Some(capability(Mode::Unknown, false)), true),
            (None, true),
        ] {
            let refused = check_capability(capability.as_ref(), readonly).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        }
    }
}
