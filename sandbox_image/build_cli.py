"""The command line of `sandbox_image/build`: the base image, a task image on top of it, or a prune.

It sits apart from both builders so that each imports only what it builds on: `task_image`
imports `image_builder`, and only this module imports both (no import cycle between them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import agent_bundle
import bundle_image
import image_builder as ib
import task_image


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="sandbox_image/build", description=ib.__doc__)
    parser.add_argument("--mirror", default=os.environ.get("SANDFLEET_DEBIAN_MIRROR", ib.DEFAULT_MIRROR))
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("base", help="the base image (the default)")
    sub.add_parser(
        "prune",
        help="remove cached and pulled images, rootfs, agent bundles and their images but the current",
    )
    sub.add_parser("agent-bundle", help="the agent bundle the local runtime mounts into foreign images")
    sub.add_parser(
        "agent-bundle-image",
        help="the agent bundle as an image, for Kubernetes (pools with agent: injected; builds the bundle)",
    )
    task_image.add_task_arguments(sub.add_parser("task", help="a task image on top of the base"))
    return parser.parse_args(argv)


def _build_base_from_args(args: argparse.Namespace) -> ib.BuiltImage:
    return ib.build_base(args.mirror)


def main(argv: list[str] | None = None) -> int:
    """Build and print the digest (and, with --json, the whole result)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("image: building needs root (mmdebstrap --mode=root, umoci unpack)", file=sys.stderr)
        return 2
    try:
        with ib.build_lock():
            if args.command == "prune":
                for name in [
                    *ib.prune(args.mirror),
                    *agent_bundle.prune(),
                    *bundle_image.prune(),
                    *ib.prune_image_store(),
                ]:
                    ib.progress(f"removed {name}")
                return 0
            if args.command == "agent-bundle":
                bundle = agent_bundle.build_bundle()
                print(json.dumps(bundle.to_json()) if args.json else bundle.path)
                return 0
            if args.command == "agent-bundle-image":
                image = bundle_image.build_bundle_image()
                print(json.dumps({**image.to_json(), "ref": image.tag}) if args.json else image.digest)
                return 0
            build = task_image.build_from_args if args.command == "task" else _build_base_from_args
            image = build(args)
    except ib.BuildError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    ib.progress(f"digest {image.digest} ({image.layout}:{image.tag})")
    if image.log is not None:
        ib.progress(f"set-up log: {image.log}")
    if args.json:
        print(json.dumps(image.to_json()))
    else:
        print(image.digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
