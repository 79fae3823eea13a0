"""Command line of hack/cluster: build, up, down, status, kubeconfig, bin-dir."""

from __future__ import annotations

import argparse
import sys

from localcluster import build
from localcluster.cluster import LocalCluster, Topology


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/cluster",
        description="A real Kubernetes control plane with kwok nodes in 3 regions, built from source.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build and cache the binaries (etcd, control plane, kwok)")
    up = commands.add_parser("up", help="start the cluster, or reuse a healthy one")
    up.add_argument("--nodes", type=int, default=Topology.nodes, help="simulated CPU nodes")
    up.add_argument("--gpu-nodes", type=int, default=Topology.gpu_nodes, help="simulated GPU nodes")
    commands.add_parser("down", help="stop everything and remove the cluster's state")
    commands.add_parser("status", help="what runs and whether it is healthy (exit 1 if not up)")
    commands.add_parser("kubeconfig", help="print the admin kubeconfig's path")
    commands.add_parser("bin-dir", help="print the directory holding kubectl and the other binaries")
    args = parser.parse_args(argv)

    cluster = LocalCluster()
    if args.command == "build":
        build.build_all()
    elif args.command == "up":
        try:
            topology = Topology(nodes=args.nodes, gpu_nodes=args.gpu_nodes)
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
        print(build.binary("kubectl").parent)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `hack/cluster status | head`: the reader left; nothing is wrong
        sys.exit(0)
