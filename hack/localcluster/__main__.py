"""Command line of hack/cluster: build, up, down, status, kubeconfig, bin-dir, import-image, trust-registry.

`up --clusters N` starts N member clusters side by side (localcluster.members); `down` stops every
member, `status` shows each, `kubeconfig --member I` names one's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from localcluster import build
from localcluster.cluster import LocalCluster, Topology
from localcluster.members import MAX_MEMBERS, member, members, started_members
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
        "--clusters",
        type=int,
        default=1,
        help=f"member clusters to run side by side, each with its own etcd, apiserver and kwok nodes "
        f"(1 to {MAX_MEMBERS}; member i keeps its state in <state dir>-m<i>, its ports shifted by "
        "100 x i); the real node, if any, joins member 0",
    )
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
    commands.add_parser("down", help="stop everything (every member) and remove the clusters' state")
    commands.add_parser("status", help="what runs and whether it is healthy, per member (exit 1 if not up)")
    kubeconfig = commands.add_parser("kubeconfig", help="print the admin kubeconfig's path")
    kubeconfig.add_argument("--member", type=int, default=0, help="which member cluster's (default 0)")
    bin_dir = commands.add_parser("bin-dir", help="print the directory holding kubectl (or another binary)")
    bin_dir.add_argument("binary", nargs="?", default="kubectl", help="e.g. helm, kubelet (default kubectl)")
    load = commands.add_parser(
        "import-image", help="import an OCI archive into the real node's containerd (no registry needed)"
    )
    load.add_argument("archive", type=Path, help="an OCI image archive (sandbox_image/build --json: archive)")
    load.add_argument(
        "--ref", help="the name Pods use, e.g. sandfleet/sandbox:0.1.0 (default: the archive's)"
    )
    load.add_argument(
        "--no-keep",
        action="store_true",
        help="no keeper Pod: the kubelet's image GC may remove it once no container uses it",
    )
    trust = commands.add_parser(
        "trust-registry",
        help="let the real node's containerd pull from HOST[:PORT] over TLS signed by CA (hosts.toml)",
    )
    trust.add_argument("host", help="the registry as image references name it, e.g. 127.0.0.1:5000")
    trust.add_argument("ca", type=Path, help="the CA certificate (PEM) that signed the registry's")
    args = parser.parse_args(argv)

    # Two `up`s of one cluster at once (two test sessions, a benchmark) would each take the other's
    # half-started daemons for a broken cluster and tear them down: one at a time, per member, and
    # each member read afresh inside its lock (what the previous holder left: a real node, or nothing).
    if args.command == "up":
        try:
            fleet = members(args.clusters)
        except ValueError as error:
            parser.error(str(error))
        for index, cluster in enumerate(fleet):
            if len(fleet) > 1:
                print(f"[hack/cluster] member {index} of {len(fleet)}: {cluster.state_dir}", file=sys.stderr)
            with _lock(cluster.state_dir):
                if _run(args, parser, member(index), real_node=index == 0) != 0:
                    return 1
        return 0
    if args.command == "down":
        for cluster in reversed(started_members()):
            with _lock(cluster.state_dir):
                _run(args, parser, LocalCluster(cluster.state_dir, cluster.ports, cluster.pod_cidr))
        return 0
    if args.command == "status":
        fleet = started_members()
        healthy = True
        for index, cluster in enumerate(fleet):
            if len(fleet) > 1:
                print(f"-- member {index}: {cluster.state_dir}")
            healthy = _run(args, parser, cluster) == 0 and healthy
        return 0 if healthy else 1
    if args.command == "kubeconfig":
        try:
            return _run(args, parser, member(args.member))
        except ValueError as error:
            parser.error(str(error))
    return _run(args, parser, LocalCluster())


@contextlib.contextmanager
def _lock(state_dir: Path) -> Iterator[None]:
    """An exclusive lock beside the state directory (which `down` removes)."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    with (state_dir.parent / f".{state_dir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(
    args: argparse.Namespace, parser: argparse.ArgumentParser, cluster: LocalCluster, real_node: bool = True
) -> int:
    if args.command == "build":
        build.build_all()
    elif args.command == "up":
        try:
            real = RealNodeSpec(region=args.real_node_region) if args.real_node and real_node else None
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
            wanted = f" --clusters {args.member + 1}" if args.member else ""
            print(f"no cluster: run `hack/cluster up{wanted}` first", file=sys.stderr)
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
        print(cluster.import_image(args.archive, args.ref, keep=not args.no_keep))
    elif args.command == "trust-registry":
        if not args.ca.is_file():
            parser.error(f"{args.ca} is not a file")
        print(cluster.trust_registry(args.host, args.ca))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `hack/cluster status | head`: the reader left; nothing is wrong
        sys.exit(0)
