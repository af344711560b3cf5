"""A CSI client on a node plugin's unix socket, as kubelet calls it: GetPluginInfo, Probe,
NodePublishVolume and NodeUnpublishVolume (for tests/python/test_kubernetes.py and kubernetes.py).

The gRPC modules are generated from vendor/csi-spec/csi.proto with grpcio-tools the first time (into
${XDG_CACHE_HOME:-~/.cache}/stfs/csi-python/HASH, HASH of the proto and the grpcio-tools version),
then imported from there. Needs grpcio and grpcio-tools (scripts/kubernetes_venv's virtualenv).

  python3 csi_client.py info unix:///PATH/csi.sock     # prints GetPluginInfo as JSON
"""
import hashlib
import importlib
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(REPO, "vendor", "csi-spec", "csi.proto")
TIMEOUT_S = 120


def modules():
    """csi_pb2 and csi_pb2_grpc, generated once per proto and grpcio-tools version."""
    import grpc_tools
    from grpc_tools import protoc

    with open(PROTO, "rb") as f:
        digest = hashlib.sha256(f.read() + grpc_tools.__file__.encode()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "stfs", "csi-python", digest)
    if not os.path.exists(os.path.join(cache, "csi_pb2_grpc.py")):
        staging = f"{cache}.{os.getpid()}"
        os.makedirs(staging, exist_ok=True)
        includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        status = protoc.main(["protoc", f"-I{os.path.dirname(PROTO)}", f"-I{includes}", f"--python_out={staging}",
                              f"--grpc_python_out={staging}", PROTO])
        if status != 0:
            sys.exit(f"csi_client: protoc failed on {PROTO} (status {status})")
        try:
            os.rename(staging, cache)
        except OSError:  # another process made it first
            pass
    if cache not in sys.path:
        sys.path.insert(0, cache)
    return importlib.import_module("csi_pb2"), importlib.import_module("csi_pb2_grpc")


class Client:
    """One channel to `endpoint` (unix:///PATH), with every call bounded by TIMEOUT_S."""

    def __init__(self, endpoint):
        import grpc

        self.pb, grpc_modules = modules()
        self.grpc = grpc
        # `:authority` is "localhost", as kubelet (1.26+, kubernetes#112597) and the CSI sidecars send
        # it: grpc-core would send the socket's path, which the plugin's HTTP/2 server (h2) refuses as
        # a malformed authority (RST_STREAM, PROTOCOL_ERROR).
        self.channel = grpc.insecure_channel(endpoint, options=[("grpc.default_authority", "localhost")])
        grpc.channel_ready_future(self.channel).result(timeout=TIMEOUT_S)
        self.identity = grpc_modules.IdentityStub(self.channel)
        self.node = grpc_modules.NodeStub(self.channel)

    def close(self):
        self.channel.close()

    def plugin_info(self):
        reply = self.identity.GetPluginInfo(self.pb.GetPluginInfoRequest(), timeout=TIMEOUT_S)
        return {"name": reply.name, "vendor_version": reply.vendor_version}

    def probe(self):
        return self.identity.Probe(self.pb.ProbeRequest(), timeout=TIMEOUT_S).ready.value

    def publish(self, volume_id, target, attributes, secrets=None, ephemeral=True):
        """NodePublishVolume of a read-only filesystem volume at `target`, as kubelet sends an inline
        volume (`ephemeral`) or a static PersistentVolume's."""
        pb = self.pb
        capability = pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(),
            access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY))
        context = dict(attributes)
        if ephemeral:
            context["csi.storage.k8s.io/ephemeral"] = "true"
        self.node.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=target, volume_capability=capability, readonly=True,
            volume_context=context, secrets=secrets or {}), timeout=TIMEOUT_S)

    def unpublish(self, volume_id, target):
        self.node.NodeUnpublishVolume(self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target),
                                      timeout=TIMEOUT_S)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "info":
        sys.exit("usage: csi_client.py info unix:///PATH/csi.sock")
    client = Client(sys.argv[2])
    try:
        print(json.dumps(client.plugin_info()))
    finally:
        client.close()
