"""Builds the local cluster's binaries from the pinned Go modules under hack/build/, cached by version."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from localcluster.paths import BUILD_MODULES, CACHE_ROOT


@dataclass(frozen=True)
class SourcePatch:
    """One line of upstream source replaced at build time, in a vendored copy; the pin stays upstream's."""

    file: str  # relative to the root of `module` (the build's own upstream module when empty)
    old: str  # must occur exactly once, or the build stops: the pin moved and the patch needs a look
    new: str
    module: str = ""


@dataclass(frozen=True)
class GoBuild:
    """One pinned upstream module and the commands we build from it."""

    name: str
    module: str  # the upstream module whose version go.mod pins
    packages: tuple[str, ...]
    cgo: bool = False
    ldflags: tuple[str, ...] = ()
    # Files copied out of the upstream module next to the binaries (kwok's stage definitions).
    module_files: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    # The directory under hack/build/ holding go.mod, when not `name` (a second build of one pin).
    module_subdir: str = ""
    patches: tuple[SourcePatch, ...] = ()

    @property
    def module_dir(self) -> Path:
        return BUILD_MODULES / (self.module_subdir or self.name)

    def version(self) -> str:
        return pinned_version(self.module_dir / "go.mod", self.module)

    def cache_dir(self) -> Path:
        """Where this build's binaries live: keyed by version plus a digest of the pins and flags."""
        digest = hashlib.sha256()
        for pin in ("go.mod", "go.sum"):
            digest.update((self.module_dir / pin).read_bytes())
        key: tuple[object, ...] = (self.packages, self.cgo, self.ldflags, self.module_files)
        if self.patches:  # only then, so the keys (and caches) of unpatched builds stay as they were
            key += (self.patches,)
        digest.update(repr(key).encode())
        return CACHE_ROOT / "bin" / f"{self.name}-{self.version()}-{digest.hexdigest()[:10]}"

    def binaries(self) -> list[Path]:
        return [self.cache_dir() / name for name in self.outputs]


def pinned_version(go_mod: Path, module: str) -> str:
    """The version `go.mod` requires for `module`."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if not match:
        raise SystemExit(f"{go_mod} does not require {module}: fix the pin in that file")
    return match.group(1)


def _kubernetes_ldflags() -> tuple[str, ...]:
    version = pinned_version(BUILD_MODULES / "kubernetes" / "go.mod", "k8s.io/kubernetes")
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


def _helm_ldflags() -> tuple[str, ...]:
    """The flags of helm's own Makefile: `helm version` prints the pin, lint knows the k8s version."""
    version = pinned_version(BUILD_MODULES / "helm" / "go.mod", "helm.sh/helm/v3")
    # helm derives the newest Kubernetes it knows from client-go v0.X -> 1.X.
    client_go = pinned_version(BUILD_MODULES / "helm" / "go.mod", "k8s.io/client-go")
    kube_minor = client_go.lstrip("v").split(".")[1]
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    flags += ["-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={kube_minor}"]
    return tuple(flags)


def _kube_router_ldflags() -> tuple[str, ...]:
    version = pinned_version(
        BUILD_MODULES / "kube-router" / "go.mod", "github.com/cloudnativelabs/kube-router/v2"
    )
    return ("-s", "-w", f"-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version={version}")


# Every build links with -s -w, which throws the debug info away: not generating it at all makes a
# cold compile a fifth faster (kwok, empty GOCACHE: 127 and 141 s with it, 102 and 105 s without)
# and the binaries the same size. Not in the cache key: the binaries behave the same either way.
NO_DWARF = "-gcflags=all=-dwarf=false"

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The real node's binaries: the same k8s.io/kubernetes pin in a module of their own
# (hack/build/kubernetes-node), so adding them left the control plane's cache key as it was.
NODE_COMMANDS = ("kubelet", "kube-proxy")
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/node/chaos/node-not-ready.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


# The real node's runsc shim, patched for this host and for Debian's containerd 1.6:
# - the shim insists on oom_score_adj -999 for itself, which needs CAP_SYS_RESOURCE; root here lacks
#   it (not in the bounding set), so a permission error is tolerated, as containerd's own shims do;
# - containerd 2's shim library answers `start` with JSON bootstrap parameters, containerd 1.6 wants
#   the bare socket address (the task API both speak is the same ttrpc task v2).
RUNSC_SHIM_PATCHES = (
    SourcePatch(
        file="pkg/shim/v1/manager.go",
        old="if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {",
        new="if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil && !os.IsPermission(err) {",
    ),
    SourcePatch(
        module="github.com/containerd/containerd/v2",
        file="pkg/shim/shim.go",
        old="data, err := json.Marshal(&params)",
        new="data, err := []byte(params.Address), error(nil); _ = json.Marshal",
    ),
)


def _gvisor_ldflags() -> tuple[str, ...]:
    version = pinned_version(BUILD_MODULES / "gvisor" / "go.mod", "gvisor.dev/gvisor")
    return ("-s", "-w", f"-X gvisor.dev/gvisor/runsc/version.version={version}")


def cluster_builds() -> list[GoBuild]:
    """The binaries a control-plane-only local cluster needs."""
    return [
        GoBuild(
            name="kubernetes",
            module="k8s.io/kubernetes",
            packages=tuple(f"k8s.io/kubernetes/cmd/{cmd}" for cmd in KUBE_COMMANDS),
            ldflags=_kubernetes_ldflags(),
            outputs=KUBE_COMMANDS,
        ),
        GoBuild(
            name="kubernetes-node",
            module="k8s.io/kubernetes",
            packages=tuple(f"k8s.io/kubernetes/cmd/{cmd}" for cmd in NODE_COMMANDS),
            # Static like the control plane: the Go build cache is shared with it, and without cgo
            # the kubelet still resolves names (the pure-Go resolver) and reads cgroups the same way.
            ldflags=_kubernetes_ldflags(),
            outputs=NODE_COMMANDS,
        ),
        GoBuild(
            # The real node's containerd-shim-runsc-v1: hack/gvisor's pin, with RUNSC_SHIM_PATCHES.
            name="runsc-shim",
            module_subdir="gvisor",
            module="gvisor.dev/gvisor",
            packages=("gvisor.dev/gvisor/shim",),
            ldflags=_gvisor_ldflags(),
            outputs=("containerd-shim-runsc-v1",),
            patches=RUNSC_SHIM_PATCHES,
        ),
        GoBuild(
            name="kube-router",
            module="github.com/cloudnativelabs/kube-router/v2",
            packages=("github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",),
            ldflags=_kube_router_ldflags(),
            outputs=("kube-router",),
        ),
        GoBuild(
            name="etcd",
            module="go.etcd.io/etcd/server/v3",
            packages=(".",),
            ldflags=("-s", "-w"),
            outputs=("etcd",),
        ),
        GoBuild(
            name="kwok",
            module="sigs.k8s.io/kwok",
            packages=("sigs.k8s.io/kwok/cmd/kwok",),
            ldflags=("-s", "-w"),
            module_files=KWOK_STAGES,
            outputs=("kwok",),
        ),
        GoBuild(
            name="helm",
            module="helm.sh/helm/v3",
            packages=("helm.sh/helm/v3/cmd/helm",),
            ldflags=_helm_ldflags(),
            outputs=("helm",),
        ),
    ]


def _go_env(build: GoBuild) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1" if build.cgo else "0"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def _count_packages(build: GoBuild, env: dict[str, str]) -> int:
    listed = subprocess.run(
        ["go", "list", "-deps", *build.packages],
        cwd=build.module_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return max(1, len(listed.stdout.split()))


def _log(message: str) -> None:
    print(f"[hack/cluster build] {message}", file=sys.stderr, flush=True)


def build(build: GoBuild) -> Path:
    """Build (or reuse) one GoBuild; print progress while compiling and the time it took."""
    out = build.cache_dir()
    if all(path.exists() for path in build.binaries()):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Two `hack/cluster build`s at once (two engineers, or a test and a benchmark) share one staging
    # directory: the second waits for the first and then finds the binaries cached.
    with (out.parent / f".{build.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(path.exists() for path in build.binaries()):
            return out
        return _build_locked(build, out)


def _build_locked(build: GoBuild, out: Path) -> Path:
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: install Go 1.24+ to build the cluster binaries")
    env = _go_env(build)
    _log(f"{build.name} {build.version()}: resolving modules (first time only)")
    subprocess.run(["go", "mod", "download"], cwd=build.module_dir, env=env, check=True)
    total = _count_packages(build, env)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    command = ["go", "build", "-v", "-trimpath", NO_DWARF, "-o", f"{staging}/"]
    if build.ldflags:
        command += ["-ldflags", " ".join(build.ldflags)]
    workdir = build.module_dir
    if build.patches:
        # `go build -overlay` refuses files in the module cache: build from a patched vendor tree.
        workdir = _patched_vendor_tree(build, env, staging.with_name(staging.name + "-vendor"))
        command.insert(2, "-mod=vendor")
    command += list(build.packages)
    if build.packages == (".",) or (build.patches and len(build.outputs) == 1):
        command[command.index("-o") + 1] = str(staging / build.outputs[0])
    _log(f"{build.name} {build.version()}: compiling up to {total} packages")
    started = time.monotonic()
    compiled = 0
    last_report = started
    with subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        errors: list[str] = []
        for line in proc.stderr:
            # `go build -v` names each package as it compiles it; anything else is an error line.
            if re.fullmatch(r"[\w./\-~+]+", line.strip()):
                compiled += 1
            else:
                errors.append(line.rstrip())
            now = time.monotonic()
            if now - last_report >= 15:
                last_report = now
                pct = min(99, 100 * compiled // total)
                _log(f"{build.name}: {compiled}/{total} packages (~{pct}%), {now - started:.0f}s")
    if proc.returncode != 0:
        raise SystemExit(f"building {build.name} {build.version()} failed:\n" + "\n".join(errors[-40:]))
    for relative in build.module_files:
        source = _module_source_dir(build, env) / relative
        shutil.copy(source, staging / Path(relative).name)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    shutil.rmtree(staging.with_name(staging.name + "-vendor"), ignore_errors=True)
    _log(f"built {build.name} {build.version()} in {time.monotonic() - started:.0f}s -> {out}")
    return out


def _patched_vendor_tree(build: GoBuild, env: dict[str, str], directory: Path) -> Path:
    """A copy of the build module with its dependencies vendored and `build.patches` applied."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for pinned in build.module_dir.iterdir():
        if pinned.is_file():
            shutil.copy(pinned, directory / pinned.name)
    subprocess.run(["go", "mod", "vendor"], cwd=directory, env=env, check=True)
    for patch in build.patches:
        target = directory / "vendor" / (patch.module or build.module) / patch.file
        text = target.read_text()
        if text.count(patch.old) != 1:
            raise SystemExit(
                f"{build.name}: the patch for {patch.file} no longer applies; review it in build.py"
            )
        target.write_text(text.replace(patch.old, patch.new))
    return directory


def _module_source_dir(build: GoBuild, env: dict[str, str]) -> Path:
    listed = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", build.module],
        cwd=build.module_dir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(listed.stdout.strip())


def build_all() -> dict[str, Path]:
    """Build every cluster binary; return each build's directory by name."""
    started = time.monotonic()
    dirs = {b.name: build(b) for b in cluster_builds()}
    _log(f"cluster binaries ready ({time.monotonic() - started:.0f}s)")
    return dirs


def binary(name: str) -> Path:
    """Where one binary (kubectl, kube-apiserver, etcd, kwok, ...) lives once built; builds nothing."""
    for candidate in cluster_builds():
        if name in candidate.outputs:
            return candidate.cache_dir() / name
    raise KeyError(name)
