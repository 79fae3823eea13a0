"""Task images: a directory, a git checkout or a pinned PyPI sdist, set up hermetically on the base image.

`build_task_image(name, source, setup=..., test_deps=..., wheels=...)` is the one implementation behind
`sandbox_image/build task` and `sandfleet task build`. The source is staged on the host (a git
checkout is exported at one commit, an sdist is fetched with pip and unpacked), copied to
/workspace, and the set-up runs in a chroot of the image as the sandbox user with a clean
environment (nothing of the host's: no PATH, PIP_* or PYENV_*), installing into the image's task
venv. With `wheels`, pip reads only that directory and the set-up runs without a network.
"""

from __future__ import annotations

import argparse
import configparser
import email.parser
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import image_builder as ib

# Bump when what a task image holds changes for the same inputs.
TASK_BUILDER_VERSION = "4"
# The task's own copy of /workspace as the image holds it, root's and read-only to everyone else:
# scoring builds its tree from here, never from what an episode left in /workspace (docs/tasks.md).
PRISTINE_WORKSPACE = "/opt/sandfleet/pristine/workspace"
# The extras a package declares its test dependencies under, by custom.
TEST_EXTRAS = ("test", "tests", "testing")
# Where --wheels is visible during the set-up (removed before the layer is recorded).
WHEELS_IN_IMAGE = "/tmp/sandfleet-wheels"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The set-up reaches PyPI through the host's network, so it trusts what the host trusts (a proxy that
# re-signs TLS included): the host's CA bundle, visible here only while the set-up runs.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_IN_IMAGE = "/tmp/sandfleet-ca.pem"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_PIN = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([0-9A-Za-z!+._-]+)\s*\Z")

SourceKind = Literal["dir", "git", "sdist"]


@dataclass(frozen=True)
class TaskSource:
    """Where a task's repository comes from: a directory, a git checkout at a revision, or an sdist."""

    kind: SourceKind
    location: str
    rev: str | None = None

    @classmethod
    def directory(cls, path: Path | str) -> TaskSource:
        """A local directory, copied as it is."""
        return cls("dir", str(path))

    @classmethod
    def git(cls, path: Path | str, rev: str | None = None) -> TaskSource:
        """A local git checkout, exported at `rev` (HEAD by default) without its history."""
        return cls("git", str(path), rev)

    @classmethod
    def sdist(cls, requirement: str) -> TaskSource:
        """A PyPI source distribution, pinned as NAME==VERSION."""
        name, version = parse_pin(requirement)
        return cls("sdist", f"{name}=={version}")

    @property
    def installs_package(self) -> bool:
        """Whether the package is installed (editable, with its test extras) by default."""
        return self.kind == "sdist"


def check_name(name: str) -> str:
    """A task name usable in an image tag, or a BuildError saying why not."""
    if not _NAME.match(name):
        raise ib.BuildError(
            f"task name {name!r}: use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )
    return name


def parse_pin(requirement: str) -> tuple[str, str]:
    """NAME==VERSION split in two; anything looser is refused, since a task must be reproducible."""
    match = _PIN.match(requirement)
    if not match:
        raise ib.BuildError(f"--sdist {requirement!r}: pin it exactly, as NAME==VERSION (e.g. six==1.16.0)")
    return match.group(1), match.group(2)


def normalize(name: str) -> str:
    """A project or extra name as PEP 503/685 compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_extras(root: Path) -> set[str]:
    """The extras a source tree declares, from whichever metadata it ships (normalized names)."""
    found: set[str] = set()
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        message = email.parser.HeaderParser().parsestr(pkg_info.read_text(errors="replace"))
        found.update(message.get_all("Provides-Extra") or [])
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(errors="replace")).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        optional = project.get("optional-dependencies", {}) if isinstance(project, dict) else {}
        if isinstance(optional, dict):
            found.update(str(key) for key in optional)
    setup_cfg = root / "setup.cfg"
    if setup_cfg.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(setup_cfg.read_text(errors="replace"))
        except configparser.Error:
            pass
        else:
            if parser.has_section("options.extras_require"):
                found.update(parser.options("options.extras_require"))
    for requires in root.glob("*.egg-info/requires.txt"):
        for line in requires.read_text(errors="replace").splitlines():
            if line.startswith("[") and line.rstrip().endswith("]"):
                extra = line.strip()[1:-1].split(":", 1)[0]
                if extra:
                    found.add(extra)
    return {normalize(extra) for extra in found}


def test_extras(root: Path) -> list[str]:
    """The test extras a source tree declares, in TEST_EXTRAS order."""
    declared = declared_extras(root)
    return [extra for extra in TEST_EXTRAS if extra in declared]


def install_command(install_package: bool, extras: Sequence[str], test_deps: Sequence[str]) -> str | None:
    """The pip command installing the package (editable, with extras) and the test dependencies.

    pytest comes with any test dependencies, and with the package: the reward runs the tests.
    """
    target: list[str] = []
    if install_package:
        target = ["-e", "." + (f"[{','.join(extras)}]" if extras else "")]
    if not target and not test_deps:
        return None
    deps = ["pytest", *[dep for dep in test_deps if normalize(dep) != "pytest"]]
    return shlex.join(["python3", "-m", "pip", "install", *target, *deps])


def setup_script(install: str | None, setup: str | None, record: bool = False) -> str | None:
    """The set-up as one shell script: the install, then the user's command, stopping at the first failure.

    record: end by listing the venv's packages with their versions, so the log says what the tests
    will run with (test dependencies are not pinned unless the caller pins them).
    """
    steps = [step for step in (install, setup) if step]
    if not steps:
        return None
    listing = ["python3 -m pip list --format=freeze"] if record else []
    return "\n".join(["set -e", "cd /workspace", *steps, *listing])


def setup_environment(offline: bool, ca_bundle: bool = False) -> dict[str, str]:
    """The whole environment the set-up sees: the image's own, never the host's."""
    env = {
        "PATH": ib.IMAGE_PATH,
        "HOME": f"/home/{ib.SANDBOX_USER}",
        "USER": ib.SANDBOX_USER,
        "LOGNAME": ib.SANDBOX_USER,
        "LANG": "C.UTF-8",
        "VIRTUAL_ENV": ib.TASK_VENV,
        # Keeps pip's cache (and its downloads) out of the image's layer.
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_PROGRESS_BAR": "off",
        "PYTHONUNBUFFERED": "1",
    }
    if offline:
        env["PIP_NO_INDEX"] = "1"
        env["PIP_FIND_LINKS"] = WHEELS_IN_IMAGE
    if ca_bundle:
        env["PIP_CERT"] = env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = CA_IN_IMAGE
    return env


def host_environment() -> dict[str, str]:
    """The environment of host-side tools (git, pip download): no PIP_*, PYENV_* or user config."""
    return {
        "PATH": HOST_PATH,
        "HOME": str(ib.cache_root().parent),
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_CACHE_DIR": str(ib.cache_root().parent / "pip"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        **({"PIP_CERT": str(HOST_CA_BUNDLE)} if HOST_CA_BUNDLE.is_file() else {}),
    }


def task_key(base_key: str, name: str, identity: str, script: str | None, wheels: str | None) -> str:
    """The cache key of a task image: every input that changes its content."""
    builder = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    inputs = [TASK_BUILDER_VERSION, builder, base_key, name, identity, script, wheels]
    return "task-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def _host(argv: list[str], what: str, cwd: Path | None = None) -> str:
    """Run a host tool with the clean host environment; its stdout, or a BuildError with its stderr."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=host_environment(), capture_output=True, text=True, timeout=900, check=False
        )
    except FileNotFoundError:
        raise ib.BuildError(f"{what}: {argv[0]} is not installed") from None
    if done.returncode != 0:
        raise ib.BuildError(f"{what} failed: {(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


def fetch_sdist(requirement: str, wheels: Path | None) -> Path:
    """The sdist archive of NAME==VERSION: from --wheels if given, else PyPI; cached per pin."""
    name, version = parse_pin(requirement)
    dest = ib.cache_root().parent / "sdists" / f"{normalize(name)}-{version}"
    found = _sdist_in(dest, name, version)
    if found is not None:
        ib.progress(f"sdist {name}=={version} cached: {found.name}")
        return found
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".sdist-", dir=dest.parent))
    try:
        where = f"--wheels {wheels}" if wheels else "PyPI"
        ib.progress(f"sdist {name}=={version}: pip download from {where}")
        index = ["--no-index", "--find-links", str(wheels)] if wheels else []
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        _host(
            [*argv, *index, "--dest", str(partial), f"{name}=={version}"], f"pip download {name}=={version}"
        )
        if _sdist_in(partial, name, version) is None:
            raise ib.BuildError(f"pip download {name}=={version} produced no sdist archive")
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    found = _sdist_in(dest, name, version)
    assert found is not None
    return found


def _sdist_in(directory: Path, name: str, version: str) -> Path | None:
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        stem = path.name.removesuffix(".tar.gz").removesuffix(".zip")
        if stem != path.name and normalize(stem) == normalize(f"{name}-{version}"):
            return path
    return None


def unpack_sdist(archive: Path, dest: Path) -> None:
    """Unpack an sdist's single top-level directory into dest (no links out, no absolute paths)."""
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=dest.parent) as scratch:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zipped:
                for member in zipped.namelist():
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise ib.BuildError(f"{archive.name}: unsafe member {member!r}")
                zipped.extractall(scratch)
        else:
            with tarfile.open(archive) as tarred:
                tarred.extractall(scratch, filter="data")
        tops = list(Path(scratch).iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise ib.BuildError(
                f"{archive.name}: expected one top-level directory, found {len(tops)} entries"
            )
        shutil.copytree(tops[0], dest, symlinks=True, dirs_exist_ok=True)


def export_git(path: Path, rev: str | None, dest: Path) -> str:
    """Export a checkout's tree at rev into dest; the full commit id."""
    if not path.is_dir():
        raise ib.BuildError(f"--git {str(path)!r} is not a directory")
    what = f"git checkout {path}"
    commit = _host(
        ["git", "-C", str(path), "rev-parse", "--verify", "--quiet", f"{rev or 'HEAD'}^{{commit}}"], what
    )
    commit = commit.strip()
    archive = subprocess.run(
        ["git", "-C", str(path), "archive", "--format=tar", commit],
        env=host_environment(),
        capture_output=True,
        timeout=900,
        check=False,
    )
    if archive.returncode != 0:
        raise ib.BuildError(
            f"git archive {commit} in {path} failed: {archive.stderr.decode(errors='replace')[-800:]}"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tarred:
        tarred.extractall(dest, filter="data")
    return commit


def init_repository(workspace: Path, message: str) -> None:
    """Make the workspace a one-commit git repository (no upstream history that could hold the fix)."""
    env_date = f"@{ib.SOURCE_DATE_EPOCH} +0000"
    identity = [
        "-c",
        "user.name=sandfleet",
        "-c",
        "user.email=sandfleet@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    _host(["git", "-c", "init.defaultBranch=main", "init", "-q"], "git init", cwd=workspace)
    _host(["git", "add", "-A", "-f"], "git add", cwd=workspace)
    env = {**host_environment(), "GIT_AUTHOR_DATE": env_date, "GIT_COMMITTER_DATE": env_date}
    done = subprocess.run(
        ["git", *identity, "commit", "-q", "--allow-empty", "-m", message],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ib.BuildError(f"git commit of the workspace failed: {done.stderr.strip()[-800:]}")


def stage(source: TaskSource, staging: Path, wheels: Path | None) -> tuple[str, dict[str, str]]:
    """Lay the source out in staging; its identity (for the cache key) and provenance (for the record)."""
    provenance = {"kind": source.kind, "location": source.location}
    if source.kind == "dir":
        path = Path(source.location)
        if not path.is_dir():
            raise ib.BuildError(f"--workspace {source.location!r} is not a directory")
        shutil.copytree(path, staging, symlinks=True, dirs_exist_ok=True)
        return "dir:" + ib.hash_tree(path), provenance
    if source.kind == "git":
        commit = export_git(Path(source.location), source.rev, staging)
        provenance["commit"] = commit
        init_repository(staging, f"task: {Path(source.location).name} at {commit}")
        return f"git:{commit}", provenance
    archive = fetch_sdist(source.location, wheels)
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    provenance.update(sdist=archive.name, sha256=sha256)
    unpack_sdist(archive, staging)
    init_repository(staging, f"task: {source.location} ({archive.name})")
    return f"sdist:{sha256}", provenance


def build_task_image(
    name: str,
    source: TaskSource,
    *,
    setup: str | None = None,
    test_deps: Sequence[str] = (),
    wheels: Path | None = None,
    install: bool | None = None,
    mirror: str = ib.DEFAULT_MIRROR,
) -> ib.BuiltImage:
    """Build (or reuse) a task image: the base plus the source as /workspace, set up in the task venv.

    install: install the package editable with its declared test extras and pytest (default: for an
    sdist only). test_deps: more requirements for the tests (pytest comes with them). wheels: a
    directory pip installs from instead of PyPI; the set-up then runs without a network. The set-up
    command is a trusted build input (it runs with the host's network unless wheels are given), not
    episode code. Raises ib.BuildError with a one-line reason; needs root.
    """
    check_name(name)
    if wheels is not None and not wheels.is_dir():
        raise ib.BuildError(f"--wheels {str(wheels)!r} is not a directory")
    with ib.build_lock():
        base = ib.build_base(mirror)
        ib.cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".stage-", dir=ib.cache_root()) as scratch:
            staging = Path(scratch) / "workspace"
            staging.mkdir()
            identity, provenance = stage(source, staging, wheels)
            extras = test_extras(staging)
            wanted = source.installs_package if install is None else install
            script = setup_script(
                install_command(wanted, extras, test_deps), setup, record=wanted or bool(test_deps)
            )
            wheels_hash = ib.hash_tree(wheels) if wheels is not None else None
            key = task_key(base.key, name, identity, script, wheels_hash)
            hit = ib.cached(key)
            if hit is not None:
                ib.progress(f"task image {name!r} cached: {key}")
                return hit
            if script:
                provenance["setup"] = script
            return _build(name, key, base, staging, script, wheels, provenance)


def _build(
    name: str,
    key: str,
    base: ib.BuiltImage,
    staging: Path,
    script: str | None,
    wheels: Path | None,
    provenance: dict[str, str],
) -> ib.BuiltImage:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=ib.cache_root()))
    tag = f"task-{name}"
    log = ib.cache_root().parent / "logs" / f"{key}.log"
    try:
        layout, bundle = work / "layout", work / "bundle"
        # Blobs are content-addressed and never modified: hard links copy the base for free.
        ib.run(["cp", "-al", str(base.layout), str(layout)], what="linking the base layout")
        ib.umoci("tag", "--image", f"{layout}:{ib.TAG}", tag, what="tag")
        image = f"{layout}:{tag}"
        ib.progress(f"task {name!r}: unpacking the base")
        ib.umoci("unpack", "--image", image, str(bundle), what="unpack")
        rootfs = bundle / "rootfs"
        ib.progress(f"task {name!r}: adding {provenance['location']} as /workspace")
        ib.run(["cp", "-a", f"{staging}/.", str(rootfs / "workspace")], what="copying the task")
        ib.run(["chown", "-R", f"{ib.SANDBOX_UID}:{ib.SANDBOX_UID}", str(rootfs / "workspace")], what="chown")
        if script:
            run_setup(name, rootfs, script, wheels, log)
        lay_pristine_copy(rootfs)
        ib.repack(image, bundle, f"task {name}")
        ib.umoci("rm", "--image", f"{layout}:{ib.TAG}", what="untag base")
        built = ib.finish(key, work, tag, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    built = replace(built, log=log if script else None, source=provenance)
    (ib.cache_root() / key / "result.json").write_text(json.dumps(built.to_json(), indent=2) + "\n")
    ib.progress(f"task image {name!r} built in {built.seconds:.1f} s")
    return built


def lay_pristine_copy(rootfs: Path) -> None:
    """Copy the set-up /workspace to PRISTINE_WORKSPACE: root's, nothing writable by anyone else."""
    pristine = rootfs / PRISTINE_WORKSPACE.lstrip("/")
    pristine.parent.mkdir(parents=True, exist_ok=True)
    ib.run(["cp", "-a", f"{rootfs / 'workspace'}/.", str(pristine)], what="copying the pristine workspace")
    byte_compile(rootfs, PRISTINE_WORKSPACE)
    ib.run(["chown", "-R", "0:0", str(pristine)], what="chown of the pristine workspace")
    ib.run(["chmod", "-R", "go-w", str(pristine)], what="chmod of the pristine workspace")
    for directory in (pristine.parent, pristine.parent.parent):
        os.chmod(directory, 0o755)


def byte_compile(rootfs: Path, directory: str) -> None:
    """Byte-compile a directory of the image with its own python, checked by hash.

    Scoring runs the tests from the pristine copy as the verifier, who cannot write there, so
    without this every score compiled pytest and the task's dependencies from source again (about
    half of its start-up, bench/scoring_speed.py). Checked hashes, not mtimes or unchecked ones: a
    scoring tree carries the episode's edits over the pristine files, and an edited module must
    never run its pristine bytecode. Files that are not Python 3 (sdists ship test data, Python 2
    modules) stay uncompiled, so compileall's exit status is not an error here.
    """
    subprocess.run(
        [
            *("chroot", str(rootfs), "/usr/bin/env", "-i", "/usr/bin/python3", "-m", "compileall", "-q"),
            *("-j", "0", "--invalidation-mode", "checked-hash", directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def run_setup(name: str, rootfs: Path, script: str, wheels: Path | None, log: Path) -> None:
    """Run the set-up in a chroot as the sandbox user, clean environment, output streamed and logged.

    The task venv is the sandbox user's only for the set-up and root's again afterwards.
    """
    venv = rootfs / ib.TASK_VENV.lstrip("/")
    staged_wheels = rootfs / WHEELS_IN_IMAGE.lstrip("/")
    staged_ca = rootfs / CA_IN_IMAGE.lstrip("/")
    online = wheels is None and HOST_CA_BUNDLE.is_file()
    env = setup_environment(offline=wheels is not None, ca_bundle=online)
    argv = [
        "chroot",
        f"--userspec={ib.SANDBOX_UID}:{ib.SANDBOX_UID}",
        str(rootfs),
        "/usr/bin/env",
        "-i",
        *[f"{k}={v}" for k, v in env.items()],
        "/bin/sh",
        "-c",
        script,
    ]
    if wheels is not None:
        # No network at all: an offline set-up that reaches for PyPI fails here, not in production.
        argv = ["unshare", "--net", *argv]
        shutil.copytree(wheels, staged_wheels)
    if online:
        shutil.copyfile(HOST_CA_BUNDLE, staged_ca)
    log.parent.mkdir(parents=True, exist_ok=True)
    ib.progress(f"task {name!r}: set-up (whole log: {log})")
    ib.run(["chown", "-R", f"{ib.SANDBOX_UID}:{ib.SANDBOX_UID}", str(venv)], what="lending the venv")
    try:
        _stream(argv, log)
    finally:
        shutil.rmtree(staged_wheels, ignore_errors=True)
        staged_ca.unlink(missing_ok=True)
        ib.run(["chown", "-R", "0:0", str(venv)], what="taking the venv back")


def _stream(argv: list[str], log: Path) -> None:
    """Run the set-up, each line to stderr (with the time since start) and the whole to the log."""
    started = time.monotonic()
    tail: list[str] = []
    with log.open("w") as out:
        out.write(f"# {shlex.join(argv)}\n")
        proc = subprocess.Popen(
            argv,
            env={"PATH": HOST_PATH},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            elapsed = time.monotonic() - started
            out.write(f"[{elapsed:7.1f}s] {line}\n")
            out.flush()
            tail = [*tail[-19:], line]
            ib.progress(f"  setup {elapsed:6.1f}s | {line}")
        code = proc.wait()
        out.write(f"# exit {code} after {time.monotonic() - started:.1f} s\n")
    if code != 0:
        last = "\n".join(tail[-5:])
        raise ib.BuildError(f"task set-up failed (exit {code}); whole log: {log}; it ended:\n{last}")
    ib.progress(f"  set-up done in {time.monotonic() - started:.1f} s")


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The `task` subcommand's options (sandbox_image/build task)."""
    parser.add_argument("--name", required=True, help="task name; the image tag becomes task-<name>")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--workspace", type=Path, help="a directory, copied to /workspace as it is")
    where.add_argument("--git", type=Path, help="a local git checkout, exported at --rev (HEAD)")
    where.add_argument("--sdist", help="a PyPI source distribution, pinned: NAME==VERSION")
    parser.add_argument("--rev", help="the commit, branch or tag of --git")
    parser.add_argument("--setup", help="shell command run in /workspace as the sandbox user")
    parser.add_argument(
        "--test-deps", action="append", default=[], metavar="REQ", help="more test requirements (repeatable)"
    )
    parser.add_argument(
        "--install",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pip install -e '.[test extras]' pytest (default: on for --sdist, off otherwise)",
    )
    parser.add_argument("--wheels", type=Path, help="install from this directory only, with no network")


def source_from_args(
    workspace: Path | None, git: Path | None, rev: str | None, sdist: str | None
) -> TaskSource:
    """The source the command line names (exactly one of them)."""
    if sum(given is not None for given in (workspace, git, sdist)) > 1:
        raise ib.BuildError("name one source: --workspace DIR, --git PATH or --sdist NAME==VERSION")
    if rev is not None and git is None:
        raise ib.BuildError("--rev goes with --git")
    if git is not None:
        return TaskSource.git(git.resolve(), rev)
    if sdist is not None:
        return TaskSource.sdist(sdist)
    if workspace is not None:
        return TaskSource.directory(workspace.resolve())
    raise ib.BuildError("name the source: --workspace DIR, --git PATH or --sdist NAME==VERSION")


def build_from_args(args: argparse.Namespace) -> ib.BuiltImage:
    """Build the task image the parsed `task` command line asks for."""
    source = source_from_args(args.workspace, args.git, args.rev, args.sdist)
    return build_task_image(
        args.name,
        source,
        setup=args.setup,
        test_deps=list(args.test_deps),
        wheels=args.wheels.resolve() if args.wheels else None,
        install=args.install,
        mirror=args.mirror,
    )
