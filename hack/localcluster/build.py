"""Builds the local cluster's binaries from the pinned Go modules under hack/build/, cached by version."""

from __future__ import annotations

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

    @property
    def module_dir(self) -> Path:
        return BUILD_MODULES / self.name

    def version(self) -> str:
        return pinned_version(self.module_dir / "go.mod", self.module)

    def cache_dir(self) -> Path:
        """Where this build's binaries live: keyed by version plus a digest of the pins and flags."""
        digest = hashlib.sha256()
        for pin in ("go.mod", "go.sum"):
            digest.update((self.module_dir / pin).read_bytes())
        digest.update(repr((self.packages, self.cgo, self.ldflags, self.module_files)).encode())
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


KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/node/chaos/node-not-ready.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


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
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: install Go 1.24+ to build the cluster binaries")
    env = _go_env(build)
    _log(f"{build.name} {build.version()}: resolving modules (first time only)")
    subprocess.run(["go", "mod", "download"], cwd=build.module_dir, env=env, check=True)
    total = _count_packages(build, env)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    command = ["go", "build", "-v", "-trimpath", "-o", f"{staging}/"]
    if build.ldflags:
        command += ["-ldflags", " ".join(build.ldflags)]
    command += list(build.packages)
    if build.packages == (".",):
        command[command.index("-o") + 1] = str(staging / build.outputs[0])
    _log(f"{build.name} {build.version()}: compiling up to {total} packages")
    started = time.monotonic()
    compiled = 0
    last_report = started
    with subprocess.Popen(
        command,
        cwd=build.module_dir,
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
    _log(f"built {build.name} {build.version()} in {time.monotonic() - started:.0f}s -> {out}")
    return out


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
