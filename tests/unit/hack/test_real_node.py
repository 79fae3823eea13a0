"""The real node's pure parts: image references, the pause image archive, and its config documents."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import re
import tarfile
import tomllib
from pathlib import Path

import pytest

from localcluster import addresses, images, realnode
from localcluster.build import RUNSC_SHIM_PATCHES, cluster_builds, pinned_version
from localcluster.paths import BUILD_MODULES
from localcluster.pki import Pki


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("sandfleet/sandbox:0.1.0", "docker.io/sandfleet/sandbox:0.1.0"),
        ("sandfleet.dev/pause:catatonit-0.1.7", "sandfleet.dev/pause:catatonit-0.1.7"),
        ("localhost/a:b", "localhost/a:b"),
        ("localhost:5000/team/app:v1", "localhost:5000/team/app:v1"),
        ("x/y@sha256:" + "a" * 64, "docker.io/x/y@sha256:" + "a" * 64),
    ],
)
def test_refs_are_normalized_as_the_cri_looks_them_up(ref: str, normalized: str) -> None:
    assert images.normalize_ref(ref) == normalized


@pytest.mark.parametrize("ref", ["", "Upper/case:1", "http://x/y:1", "a b:1", "x/y:bad tag"])
def test_bad_refs_are_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        images.normalize_ref(ref)


def test_pause_tag_holds_only_tag_characters() -> None:
    ref = images.pause_ref("0.1.7-1+b2")
    assert ref == "sandfleet.dev/pause:catatonit-0.1.7-1-b2"
    assert images.normalize_ref(ref) == ref


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_oci_archive_is_a_valid_deterministic_layout() -> None:
    files = {"/catatonit": (b"\x7fELF fake", 0o755)}
    first = images.oci_archive(files, entrypoint=["/catatonit", "-P"], user="65535:65535", ref="a.b/c:d")
    again = images.oci_archive(files, entrypoint=["/catatonit", "-P"], user="65535:65535", ref="a.b/c:d")
    assert first == again
    members = _members(first)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, payload in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(payload).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(members["index.json"])["manifests"]
    assert entry["annotations"][images.CONTAINERD_NAME] == "a.b/c:d"
    manifest = json.loads(members[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"])
    config = json.loads(members[f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}"])
    assert config["config"]["Entrypoint"] == ["/catatonit", "-P"]
    (layer,) = manifest["layers"]
    layer_bytes = members[f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # uncompressed: diff id = digest
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode) == ("catatonit", 0o755)


def test_renamed_index_names_the_one_image_for_containerd() -> None:
    index = {"manifests": [{"digest": "sha256:x", "annotations": {images.OCI_REF_NAME: "sandfleet"}}]}
    renamed = images.renamed_index(index, "docker.io/sandfleet/sandbox:0.1.0")
    assert renamed["manifests"][0]["annotations"] == {
        images.OCI_REF_NAME: "sandfleet",
        images.CONTAINERD_NAME: "docker.io/sandfleet/sandbox:0.1.0",
    }
    assert images.CONTAINERD_NAME not in index["manifests"][0]["annotations"]  # the input is untouched
    with pytest.raises(ValueError, match="exactly one image"):
        images.renamed_index({"manifests": [{}, {}]}, "a.b/c:d")


def test_address_plan_does_not_overlap() -> None:
    ranges = [
        ipaddress.ip_network(addresses.SERVICE_CIDR),
        ipaddress.ip_network(addresses.KWOK_POD_CIDR),
        ipaddress.ip_network(addresses.REAL_POD_CIDR),
        ipaddress.ip_network(f"{addresses.NODE_IP}/32"),
    ]
    for index, one in enumerate(ranges):
        for other in ranges[index + 1 :]:
            assert not one.overlaps(other), (one, other)
    assert all(r.is_private for r in ranges)
    assert ipaddress.ip_address(addresses.KUBERNETES_SERVICE_IP) in ranges[0]
    assert ipaddress.ip_address(addresses.REAL_POD_GATEWAY) in ranges[2]


def test_containerd_config_keeps_everything_under_the_node_root(tmp_path: Path) -> None:
    config = tomllib.loads(realnode.containerd_config(tmp_path, "sandfleet.dev/pause:x"))
    assert config["version"] == 2
    for key in ("root", "state"):
        assert config[key].startswith(str(tmp_path))
    assert config["grpc"]["address"].startswith(str(tmp_path))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "sandfleet.dev/pause:x"
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["restrict_oom_score_adj"] is True
    runtimes = cri["containerd"]["runtimes"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert runtimes["runc"]["options"]["Root"].startswith(str(tmp_path))
    assert runtimes["runsc"]["runtime_type"] == "io.containerd.runsc.v1"
    assert runtimes["runsc"]["options"]["ConfigPath"] == str(tmp_path / "runsc.toml")
    assert cri["cni"]["conf_dir"].startswith(str(tmp_path))
    assert cri["registry"]["config_path"] == str(tmp_path / realnode.REGISTRY_HOSTS_DIR)


def test_a_trusted_registry_gets_a_hosts_toml_with_its_ca(tmp_path: Path) -> None:
    hosts = tomllib.loads(realnode.registry_hosts_toml("127.0.0.1:5000", tmp_path / "ca.crt"))
    assert hosts["server"] == "https://127.0.0.1:5000"
    host = hosts["host"]["https://127.0.0.1:5000"]
    assert host == {"capabilities": ["pull", "resolve"], "ca": str(tmp_path / "ca.crt")}


def test_image_gc_thresholds_move_by_environment_and_are_checked() -> None:
    env = {"SANDFLEET_IMAGE_GC_HIGH": "2", "SANDFLEET_IMAGE_GC_LOW": "1", "SANDFLEET_IMAGE_GC_MIN_AGE": "0s"}
    assert realnode.image_gc_policy(env) == {
        "imageGCHighThresholdPercent": 2,
        "imageGCLowThresholdPercent": 1,
        "imageMinimumGCAge": "0s",
    }
    with pytest.raises(SystemExit):
        realnode.image_gc_policy({"SANDFLEET_IMAGE_GC_HIGH": "50", "SANDFLEET_IMAGE_GC_LOW": "60"})


@pytest.mark.parametrize("ref", ["sandfleet/sandbox:0.1.0", "localhost/sandfleet/agent-bundle:0.1.0"])
def test_a_keeper_pod_uses_its_image_and_sleeps_with_the_bundles_busybox(ref: str) -> None:
    bundle = "localhost/sandfleet/agent-bundle:0.1.0"
    pod = realnode.keeper_pod(ref, bundle)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == ref
    assert container["imagePullPolicy"] == "Never"
    assert container["command"][-2:] == realnode.KEEPER_SLEEP
    assert container["securityContext"]["runAsNonRoot"] is True
    assert "runtimeClassName" not in spec  # runc: it only has to exist
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeName"] == realnode.NODE_NAME
    assert pod["metadata"]["name"] == realnode.keeper_name(ref)
    assert pod["metadata"]["annotations"][realnode.KEEPER_IMAGE_ANNOTATION] == ref
    if ref == bundle:
        assert "initContainers" not in spec
    else:
        (init,) = spec["initContainers"]
        assert init["image"] == bundle
        assert container["command"][0] == "/keep/busybox"


def test_pods_get_no_default_route(tmp_path: Path) -> None:
    bridge = realnode.cni_config(tmp_path)["plugins"][0]
    routes = [ipaddress.ip_network(r["dst"]) for r in bridge["ipam"]["routes"]]
    assert ipaddress.ip_network("0.0.0.0/0") not in routes
    assert routes == [
        ipaddress.ip_network(f"{addresses.NODE_IP}/32"),
        ipaddress.ip_network(addresses.SERVICE_CIDR),
    ]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path))


def test_kubelet_config_fits_this_host(tmp_path: Path) -> None:
    config = realnode.kubelet_config(tmp_path, Pki(tmp_path / "pki"), realnode.NodePorts(kubelet=30250))
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failCgroupV1"] is False
    assert config["failSwapOn"] is False
    assert config["clusterDNS"] == []
    assert config["port"] == 30250
    assert config["address"] == addresses.NODE_IP
    assert config["readOnlyPort"] == 0
    # Image GC is on (pulled images are collected); imported ones are held by keeper Pods instead.
    assert 0 < config["imageGCLowThresholdPercent"] < config["imageGCHighThresholdPercent"] < 100
    assert config["imageMinimumGCAge"] == realnode.IMAGE_GC_MIN_AGE
    for key in ("podLogsDirectory", "resolvConf", "volumePluginDir"):
        assert config[key].startswith(str(tmp_path))


def test_kube_proxy_listens_on_loopback_only(tmp_path: Path) -> None:
    config = realnode.kube_proxy_config(tmp_path / "kubeconfig", realnode.NodePorts())
    assert config["mode"] == "iptables"
    assert config["healthzBindAddress"].startswith("127.0.0.1:")
    assert config["metricsBindAddress"].startswith("127.0.0.1:")
    assert config["nodePortAddresses"] == [f"{addresses.NODE_IP}/32"]
    assert config["conntrack"]["maxPerCore"] == 0


def test_real_node_spec_labels_and_region_check() -> None:
    spec = realnode.RealNodeSpec(region="europe-west4")
    assert spec.labels() == {
        "topology.kubernetes.io/region": "europe-west4",
        "topology.kubernetes.io/zone": "europe-west4-a",
        "sandfleet.dev/real-node": "true",
    }
    with pytest.raises(ValueError, match="--real-node-region"):
        realnode.RealNodeSpec(region="mars-north1")
    kubelet = next(i for i in realnode.identities(spec) if i.file_stem == "kubelet")
    assert kubelet.user == f"system:node:{spec.name}"
    assert kubelet.groups == ("system:nodes",)


def test_real_node_spec_round_trips(tmp_path: Path) -> None:
    spec = realnode.RealNodeSpec(region="asia-southeast1")
    spec.save(tmp_path / "real-node.json")
    assert realnode.RealNodeSpec.load(tmp_path / "real-node.json") == spec
    assert realnode.RealNodeSpec.load(tmp_path / "missing.json") is None


def test_node_binaries_pin_the_control_planes_kubernetes() -> None:
    """kubelet and kube-proxy come from their own module: it must pin what the control plane pins."""
    control, node = (BUILD_MODULES / name / "go.mod" for name in ("kubernetes", "kubernetes-node"))
    assert pinned_version(node, "k8s.io/kubernetes") == pinned_version(control, "k8s.io/kubernetes")

    def replaces(go_mod: Path) -> set[str]:
        return set(re.findall(r"^\s*(k8s\.io/\S+ => \S+ \S+)", go_mod.read_text(), re.M))

    assert replaces(node) == replaces(control)
    assert len(replaces(node)) >= 31


def test_every_real_node_binary_is_built_by_hack_cluster_build() -> None:
    outputs = {name for build in cluster_builds() for name in build.outputs}
    assert {"kubelet", "kube-proxy", "kube-router", "containerd-shim-runsc-v1"} <= outputs
    shim = next(b for b in cluster_builds() if "containerd-shim-runsc-v1" in b.outputs)
    assert shim.patches == RUNSC_SHIM_PATCHES
    assert pinned_version(BUILD_MODULES / "gvisor" / "go.mod", "gvisor.dev/gvisor") == shim.version()
