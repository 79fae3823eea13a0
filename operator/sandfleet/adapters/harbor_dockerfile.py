"""A Harbor task's `environment/Dockerfile` made buildable offline: FROM rewritten, buildah's argv, errors.

Pure: the build itself (buildah, daemonless, no network for RUN steps) and the registry probe are
`sandfleet.cli.harbor_commands`. A `FROM` naming an image whose registry cannot be reached is
rewritten to a configured local base image (an `oci-archive:PATH`, or any reference buildah
takes), and each rewrite is reported as a note; `scratch` and earlier stages (`FROM build AS ...`
then `FROM build`) are kept. A failed build is told as the step that failed, and why when its output
shows a step that needed the network.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DOCKER_HUB = "docker.io"
# Where the Docker Hub name resolves: a probe of docker.io itself says nothing.
REGISTRY_HOSTS = {DOCKER_HUB: "registry-1.docker.io"}
# Lines a step prints when it wanted the network and had none (apt, pip, curl, wget, git, DNS).
_NETWORK_SIGNS = re.compile(
    r"Temporary failure (in name resolution|resolving)|Could not resolve|Name or service not known"
    r"|Network is unreachable|No route to host|Connection refused|Failed to establish a new connection"
    r"|unable to access '|Failed to fetch|Unable to locate package|getaddrinfo",
    re.IGNORECASE,
)
_FAILED_STEP = re.compile(r'building at STEP "(?P<step>.*?)": (?P<why>.*)$', re.MULTILINE)
_FROM = re.compile(r"^(?P<lead>\s*FROM\s+)(?P<rest>.*?)\s*$", re.IGNORECASE)


class DockerfileError(ValueError):
    """A Dockerfile this builder cannot use, said in one line."""


@dataclass(frozen=True)
class FromRewrite:
    """The Dockerfile to build, and one note per FROM it rewrote."""

    text: str
    notes: list[str] = field(default_factory=list)


def registry_of(image: str) -> str:
    """The registry an image reference names, as Docker reads it (no host: Docker Hub)."""
    image = image.split("://", 1)[-1]
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def registry_host(registry: str) -> tuple[str, int]:
    """(host, port) to probe for `registry`: Docker Hub's real host, 443 unless a port is named."""
    host = REGISTRY_HOSTS.get(registry, registry)
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit():
        return name, int(port)
    return host, 443


def _split_from(rest: str) -> tuple[list[str], str, str]:
    """(flags such as --platform, the image, the rest: `AS name`) of a FROM line's arguments."""
    words = rest.split()
    flags = [word for word in words if word.startswith("--")]
    others = [word for word in words if not word.startswith("--")]
    if not others:
        raise DockerfileError(f"a FROM without an image: FROM {rest}")
    return flags, others[0], " ".join(others[1:])


def _joined_lines(text: str) -> list[str]:
    """The Dockerfile's instructions, each on one line (backslash continuations joined, comments out)."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((pending + line).strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def steps(text: str) -> list[str]:
    """The instructions buildah numbers as its steps (`STEP 3/4: RUN ...`)."""
    return _joined_lines(text)


def rewrite_from(
    text: str, base: str | None, reachable: Callable[[str], bool], *, offline: bool = False
) -> FromRewrite:
    """`text` with each FROM whose registry is not `reachable` pointed at `base`, and a note for each.

    `reachable(registry)` is asked once per registry; `offline` asks none and rewrites every registry
    FROM (a hermetic build, the same with or without a network). Without `base`, a FROM to rewrite is
    an error that says what to pass.
    """
    stages: set[str] = set()
    answers: dict[str, bool] = {}
    notes: list[str] = []
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = _FROM.match(line)
        if match is None or line.rstrip().endswith("\\"):
            continue
        flags, image, tail = _split_from(match.group("rest"))
        if tail.lower().startswith("as "):
            stages.add(tail.split()[-1].lower())
        if image.lower() == "scratch" or image.lower() in stages or image.startswith("$"):
            continue
        if "://" not in image and image.split(":", 1)[0] in {"oci", "oci-archive", "docker-archive", "dir"}:
            continue  # already a local reference buildah reads from this host
        registry = registry_of(image)
        if registry not in answers:
            answers[registry] = False if offline else reachable(registry)
        if answers[registry]:
            continue
        if base is None:
            unused = "is not used (--offline)" if offline else "cannot be reached from here"
            raise DockerfileError(
                f"FROM {image} names {registry}, which {unused}: "
                "give a local base image to build on (--base oci-archive:PATH)"
            )
        new = " ".join([*flags, base, *([tail] if tail else [])])
        lines[index] = f"{match.group('lead')}{new}\n"
        why = "--offline" if offline else f"{registry} cannot be reached"
        notes.append(f"FROM {image} rewritten to FROM {base} ({why})")
    return FromRewrite("".join(lines), notes)


def buildah_argv(
    dockerfile: Path,
    context: Path,
    out: str,
    storage: Path,
    *,
    buildah: str = "buildah",
    auth_file: Path | None = None,
    cert_dir: Path | None = None,
) -> list[str]:
    """`buildah build` with its own storage under `storage`, RUN steps without network, into `out`.

    `out` is a destination buildah writes (`oci-archive:PATH`). vfs needs no kernel overlay
    support; `--pull=missing` fetches a FROM kept because its registry answered (the storage starts
    empty; an archive base is read in place); `--network=none` (RUN steps only) needs the oci
    isolation (chroot runs on the host's network). `auth_file` (a containers-auth.json) and `cert_dir`
    (a registry's CA as `ca.crt`) are for a base in a private registry, such as a local one.
    """
    return [
        buildah,
        "--root",
        str(storage / "root"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "vfs",
        "build",
        "--network=none",
        "--isolation=oci",
        "--pull=missing",
        "--layers=false",
        *(["--authfile", str(auth_file)] if auth_file else []),
        *(["--cert-dir", str(cert_dir)] if cert_dir else []),
        "-f",
        str(dockerfile),
        "-t",
        out,
        str(context),
    ]


def build_error(output: str, dockerfile_steps: Sequence[str]) -> str:
    """Why the build failed, in one line: the step by number and text, and whether it wanted the network."""
    failures = list(_FAILED_STEP.finditer(output))
    if not failures:
        lines = [line for line in output.splitlines() if line.strip()]
        return "buildah failed: " + (lines[-1].strip() if lines else "no output")
    found = failures[-1]
    step, why = found.group("step"), found.group("why").strip()
    said = " ".join(step.split())
    number = next((i for i, known in enumerate(dockerfile_steps, 1) if " ".join(known.split()) == said), None)
    where = f"step {number}/{len(dockerfile_steps)}" if number else "a step"
    before = output[: found.start()]
    own = before[before.rfind("STEP ") :] if "STEP " in before else before  # the failed step's output
    message = f"{where} failed: {step} ({why})"
    if _NETWORK_SIGNS.search(own):
        message += (
            "; it needed the network, and RUN steps here have none: put what it downloads into the "
            "base image (--base) or into environment/ and COPY it"
        )
    return message
