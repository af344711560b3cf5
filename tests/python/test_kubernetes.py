"""The Kubernetes deployment files (deploy/kubernetes/) checked offline: against the schemas of a
current Kubernetes release (kubernetes-validate, strict: an unknown field fails too), and against the
code and docs: the driver name is the one `stfs csi` answers to GetPluginInfo, the DaemonSet's flags
are `stfs csi`'s, every volume attribute and secret key the examples use is documented in
docs/kubernetes.md, and stfs-csi-node (the container's command) starts the plugin again after a
SIGKILL, its socket answering, and passes SIGTERM on.

kubernetes-validate and the gRPC client live in scripts/kubernetes_venv's virtualenv (made once,
reused); these tests run its programs as child processes.
"""
import json
import os
import re
import signal
import subprocess
import tempfile

import pytest

from conftest import ROOT, stop_process, wait_until

DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
KUBERNETES_VERSION = "1.37.0"
CSI_CLIENT = os.path.join(ROOT, "scripts", "bench", "csi_client.py")
DRIVER_KINDS = {"csidriver", "daemonset", "serviceaccount", "pod", "secret", "persistentvolume", "persistentvolumeclaim"}


@pytest.fixture(scope="module")
def kube_python():
    """The python of scripts/kubernetes_venv's virtualenv (made the first time, about a minute)."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "kubernetes_venv")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"scripts/kubernetes_venv failed: {out.stderr}"
    return out.stdout.strip()


def manifests():
    return sorted(os.path.join(DEPLOY, f) for f in os.listdir(DEPLOY) if f.endswith(".yaml"))


def validate(kube_python, files):
    program = os.path.join(os.path.dirname(kube_python), "kubernetes-validate")
    return subprocess.run([program, "--kubernetes-version", KUBERNETES_VERSION, "--strict", *files],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def documents(kube_python):
    """Every YAML document of deploy/kubernetes/, as (file name, object)."""
    code = ("import json, os, sys, yaml\n"
            "print(json.dumps([[os.path.basename(f), d] for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))")
    out = subprocess.run([kube_python, "-c", code, *manifests()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def of_kind(documents, kind):
    return [d for _, d in documents if d["kind"] == kind]


def doc_table_names(heading):
    """The first column's `names` of the first table under `## heading` in docs/kubernetes.md."""
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as f:
        text = f.read()
    section = text.split(f"\n## {heading}\n", 1)
    assert len(section) == 2, f"docs/kubernetes.md has no section '## {heading}'"
    names = re.findall(r"^\| `([^`]+)` \|", section[1].split("\n## ", 1)[0], re.M)
    assert names, f"docs/kubernetes.md, '## {heading}': no table"
    return set(names)


def test_every_manifest_passes_the_schemas_of_a_current_kubernetes(kube_python):
    files = manifests()
    out = validate(kube_python, files)
    assert out.returncode == 0, out.stdout + out.stderr
    checked = set(re.findall(r"passed for resource (\w+)/", out.stdout + out.stderr))
    assert DRIVER_KINDS <= checked, f"kinds not checked: {DRIVER_KINDS - checked}"


def test_the_check_refuses_a_manifest_with_a_wrong_type_or_an_unknown_field(kube_python, tmp_path):
    """The check above can fail: a boolean written as a word and a field the schema lacks are each refused,
    naming the field."""
    with open(os.path.join(DEPLOY, "csidriver.yaml")) as f:
        driver = f.read()
    with open(os.path.join(DEPLOY, "daemonset.yaml")) as f:
        daemonset = f.read()
    cases = {
        "wrong-type.yaml": (driver.replace("attachRequired: false", 'attachRequired: "no"'), "attachRequired"),
        "unknown-field.yaml": (daemonset.replace(
            "      serviceAccountName: stfs-csi-node", "      serviceAccountName: stfs-csi-node\n      mountsSurvive: true"),
            "mountsSurvive"),
    }
    for name, (text, field) in cases.items():
        assert field in text, f"the mutation of {name} did not apply"
        path = tmp_path / name
        path.write_text(text)
        out = validate(kube_python, [str(path)])
        assert out.returncode != 0, f"{name} passed: {out.stdout}"
        assert field in out.stdout + out.stderr, out.stdout + out.stderr


def test_every_file_names_the_one_driver(documents):
    (driver,) = of_kind(documents, "CSIDriver")
    name = driver["metadata"]["name"]
    assert driver["spec"]["attachRequired"] is False and driver["spec"]["podInfoOnMount"] is True
    assert set(driver["spec"]["volumeLifecycleModes"]) == {"Ephemeral", "Persistent"}
    (daemonset,) = of_kind(documents, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    registrar = next(c for c in pod["containers"] if c["name"] == "node-driver-registrar")
    assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{name}/csi.sock" in registrar["args"]
    plugin_dir = next(v for v in pod["volumes"] if v["name"] == "plugin-dir")
    assert plugin_dir["hostPath"]["path"] == f"/var/lib/kubelet/plugins/{name}"
    used = [v["csi"]["driver"] for p in of_kind(documents, "Pod") for v in p["spec"]["volumes"] if "csi" in v]
    used += [pv["spec"]["csi"]["driver"] for pv in of_kind(documents, "PersistentVolume")]
    assert used and set(used) == {name}, used
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as f:
        assert f"**`{name}`**" in f.read(), "docs/kubernetes.md names another driver"


def test_the_daemonset_mounts_what_the_plugin_needs(documents):
    (daemonset,) = of_kind(documents, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    stfs = next(c for c in pod["containers"] if c["name"] == "stfs")
    assert stfs["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in stfs["volumeMounts"]}
    assert mounts["/var/lib/kubelet"].get("mountPropagation") == "Bidirectional"
    assert "/dev/fuse" in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    flags = dict(a.split("=", 1) for a in stfs["args"])
    for flag in ("--state-dir", "--cache-dir"):
        (mount,) = [m for m in stfs["volumeMounts"] if m["mountPath"] == flags[flag]]
        assert "hostPath" in volumes[mount["name"]], f"{flag} {flags[flag]} is not a hostPath"
    # The daemons outlive the container: they join a cgroup in the host's tree, mounted from the
    # host, and the pod shares the host's PID namespace (a container's own would end them with it).
    assert pod.get("hostPID") is True
    cgroup_mounts = [m for m in stfs["volumeMounts"] if flags["--daemon-cgroup"].startswith(m["mountPath"] + "/")]
    assert [volumes[m["name"]]["hostPath"]["path"] for m in cgroup_mounts] == ["/sys/fs/cgroup"], cgroup_mounts
    images = {c["name"]: c["image"] for c in pod["containers"]}
    assert {"node-driver-registrar", "livenessprobe"} <= set(images)
    assert all(re.search(r":v\d+\.\d+\.\d+$", images[n]) for n in ("node-driver-registrar", "livenessprobe")), images


def test_the_examples_use_documented_attributes_and_secret_keys(documents):
    attributes = doc_table_names("Volume attributes")
    keys = doc_table_names("Secrets")
    used = [v["csi"].get("volumeAttributes", {}) for p in of_kind(documents, "Pod") for v in p["spec"]["volumes"] if "csi" in v]
    used += [pv["spec"]["csi"]["volumeAttributes"] for pv in of_kind(documents, "PersistentVolume")]
    assert len(used) >= 2
    for given in used:
        assert "source" in given
        assert set(given) <= attributes, f"not in docs/kubernetes.md's attributes: {set(given) - attributes}"
    secrets = of_kind(documents, "Secret")
    assert secrets
    for secret in secrets:
        given = set(secret.get("stringData", {})) | set(secret.get("data", {}))
        assert given <= keys, f"not in docs/kubernetes.md's secret keys: {given - keys}"
    refs = [pv["spec"]["csi"]["nodePublishSecretRef"]["name"] for pv in of_kind(documents, "PersistentVolume")]
    assert set(refs) <= {s["metadata"]["name"] for s in secrets}


def plugin_info(kube_python, socket):
    out = subprocess.run([kube_python, CSI_CLIENT, "info", f"unix://{socket}"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


CGROUPS_MADE = []  # cgroups plugin_args named for --daemon-cgroup, removed by the fixture below


def cgroup2_hierarchy():
    """Where cgroup v2 is mounted here (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid machine)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return fields[4]
    pytest.fail("no cgroup v2 hierarchy mounted: the DaemonSet's --daemon-cgroup needs one")


@pytest.fixture(autouse=True)
def remove_test_cgroups():
    yield
    while CGROUPS_MADE:
        path = CGROUPS_MADE.pop()
        if os.path.isdir(path):
            os.rmdir(path)  # empty: the plugins these tests start mount nothing


def plugin_args(documents, folder):
    """The DaemonSet's `stfs csi` arguments with its host paths moved under `folder`."""
    (daemonset,) = of_kind(documents, "DaemonSet")
    stfs = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "stfs")
    args = []
    for arg in stfs["args"]:
        flag, value = arg.split("=", 1)
        if flag == "--endpoint":
            value = f"unix://{folder}/csi.sock"
        elif flag == "--node-id":
            value = "test-node"
        elif flag == "--daemon-cgroup":
            value = os.path.join(cgroup2_hierarchy(), f"stfs-kube-test-{os.getpid()}-{os.path.basename(folder)}")
            CGROUPS_MADE.append(value)
        else:
            value = os.path.join(folder, flag.lstrip("-"))
            os.makedirs(value, exist_ok=True)
        args.append(f"{flag}={value}")
    return args


def plugins(pid):
    """The `stfs csi` processes among `pid`'s children (not the `sleep` between two)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        found = []
        for child in f.read().split():
            try:
                with open(f"/proc/{child}/cmdline", "rb") as c:
                    if c.read().split(b"\0")[1:2] == [b"csi"]:
                        found.append(int(child))
            except OSError:
                pass
        return found


def test_the_driver_name_is_what_the_plugin_answers(kube_python, documents, stfs_bin):
    (driver,) = of_kind(documents, "CSIDriver")
    with tempfile.TemporaryDirectory(prefix="stfs-kube-") as folder:
        plugin = subprocess.Popen([stfs_bin, "csi", *plugin_args(documents, folder)], stderr=subprocess.PIPE, text=True)
        try:
            socket = os.path.join(folder, "csi.sock")
            assert wait_until(lambda: os.path.exists(socket) or plugin.poll() is not None, 30), "no socket in 30 s"
            assert plugin.poll() is None, f"stfs csi with the DaemonSet's flags exited: {plugin.stderr.read()}"
            assert plugin_info(kube_python, socket)["name"] == driver["metadata"]["name"]
        finally:
            stop_process(plugin)


def test_stfs_csi_node_starts_the_plugin_again_after_a_sigkill(kube_python, documents, stfs_bin):
    with tempfile.TemporaryDirectory(prefix="stfs-kube-") as folder:
        socket = os.path.join(folder, "csi.sock")
        supervisor = subprocess.Popen([os.path.join(DEPLOY, "stfs-csi-node"), *plugin_args(documents, folder)],
                                      env=dict(os.environ, STFS=stfs_bin), stderr=subprocess.PIPE, text=True)
        try:
            assert wait_until(lambda: len(plugins(supervisor.pid)) == 1 and os.path.exists(socket), 30)
            (first,) = plugins(supervisor.pid)
            assert plugin_info(kube_python, socket)["name"]
            os.kill(first, signal.SIGKILL)
            assert wait_until(lambda: plugins(supervisor.pid) not in ([], [first]), 30), "no new plugin within 30 s"
            assert plugin_info(kube_python, socket)["name"], "the new plugin does not answer on the socket"
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=30)
            assert "starting it again" in supervisor.stderr.read()
        finally:
            stop_process(supervisor)
