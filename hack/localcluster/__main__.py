"""Command line of hack/cluster: build, up, down, status, kubeconfig, bin-dir, import-image."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from localcluster import build
from localcluster.cluster import LocalCluster, Topology
from localcluster.realnode import RealNodeSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/cluster",
        description="A real Kubernetes control plane with kwok nodes in 3 regions, built from source.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "build", help="build and cache the binaries (etcd, control plane, kwok, the real node's)"
    )
    up = commands.add_parser("up", help="start the cluster, or reuse a healthy one")
    up.add_argument("--nodes", type=int, default=Topology.nodes, help="simulated CPU nodes")
    up.add_argument("--gpu-nodes", type=int, default=Topology.gpu_nodes, help="simulated GPU nodes")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run one real node (containerd with runc and gVisor's runsc, kubelet, kube-proxy, "
        "kube-router for NetworkPolicy); see docs/real-node.md",
    )
    up.add_argument(
        "--real-node-region",
        default=RealNodeSpec.region,
        help="the real node's topology.kubernetes.io/region (default %(default)s)",
    )
    commands.add_parser("down", help="stop everything and remove the cluster's state")
    commands.add_parser("status", help="what runs and whether it is healthy (exit 1 if not up)")
    commands.add_parser("kubeconfig", help="print the admin kubeconfig's path")
    bin_dir = commands.add_parser("bin-dir", help="print the directory holding kubectl (or another binary)")
    bin_dir.add_argument("binary", nargs="?", default="kubectl", help="e.g. helm, kubelet (default kubectl)")
    load = commands.add_parser(
        "import-image", help="import an OCI archive into the real node's containerd (no registry needed)"
    )
    load.add_argument("archive", type=Path, help="an OCI image archive (sandbox_image/build --json: archive)")
    load.add_argument(
        "--ref", help="the name Pods use, e.g. sandfleet/sandbox:0.1.0 (default: the archive's)"
    )
    args = parser.parse_args(argv)

    cluster = LocalCluster()
    if args.command in ("up", "down"):
        # Two `up`s of one cluster at once (two test sessions, a benchmark) would each take the
        # other's half-started daemons for a broken cluster and tear them down: one at a time.
        with _lock(cluster.state_dir):
            cluster = LocalCluster()  # what the previous holder left (a real node, or nothing)
            return _run(args, parser, cluster)
    return _run(args, parser, cluster)


@contextlib.contextmanager
def _lock(state_dir: Path) -> Iterator[None]:
    """An exclusive lock beside the state directory (which `down` removes)."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    with (state_dir.parent / f".{state_dir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser, cluster: LocalCluster) -> int:
    if args.command == "build":
        build.build_all()
    elif args.command == "up":
        try:
            real = RealNodeSpec(region=args.real_node_region) if args.real_node else None
            topology = Topology(nodes=args.nodes, gpu_nodes=args.gpu_nodes, real_node=real)
            cluster.up(topology)
        except ValueError as error:
            parser.error(str(error))
    elif args.command == "down":
        cluster.down()
    elif args.command == "status":
        return 0 if cluster.status() else 1
    elif args.command == "kubeconfig":
        if not cluster.kubeconfig.exists():
            print("no cluster: run `hack/cluster up` first", file=sys.stderr)
            return 1
        print(cluster.kubeconfig)
    elif args.command == "bin-dir":
        try:
            print(build.binary(args.binary).parent)
        except KeyError:
            known = sorted({name for b in build.cluster_builds() for name in b.outputs})
            parser.error(f"no binary {args.binary!r}; hack/cluster builds: {', '.join(known)}")
    elif args.command == "import-image":
        if not args.archive.is_file():
            parser.error(f"{args.archive} is not a file")
        print(cluster.import_image(args.archive, args.ref))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `hack/cluster status | head`: the reader left; nothing is wrong
        sys.exit(0)
