"""Benchmark: the reference async RL loop on local gVisor sandboxes, and the loop profile it reports.

Prints progress, then one JSON object as its last line: episodes, lease latency seen by the
actors, learner steps, and the gateway's loop profile (phase p50/p99, the generation / sandbox /
scoring / training split and the verdict). This is `make demo` without its prose: a `sandfleet
serve --local --tasks` gateway on its own port, then `sandfleet rl run` against it.

    .venv/bin/python bench/rl_loop.py            # full: 2 actors for 120 s
    .venv/bin/python bench/rl_loop.py --short    # CI: 2 actors for 12 s
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localbench import log, serving_tasks

REPO = Path(__file__).resolve().parents[1]
SANDFLEET = REPO / ".venv" / "bin" / "sandfleet"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    seconds = args.seconds or (12.0 if args.short else 120.0)
    run = f"bench-{int(time.time())}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-rl-") as tmp:
        log("rl", "starting the embedded gateway with the task image (built on first use)")
        policies = ["--policy-file", str(Path(tmp) / "policies.json")]
        with serving_tasks(Path(tmp), 6, *policies) as url:
            log("rl", f"RL loop: 2 actors and a learner for {seconds:.0f}s (run {run})")
            summary_path = Path(tmp) / "summary.json"
            result = subprocess.run(
                [str(SANDFLEET), "rl", "run", "--run", run, "--pool", "default", "--actors", "2",
                 "--duration", str(seconds), "--summary-json", str(summary_path)],
                env={**os.environ, "SANDFLEET_URL": url}, cwd=REPO, capture_output=True, text=True,
                timeout=seconds + 600,
            )  # fmt: skip
            if result.returncode != 0:
                raise SystemExit(
                    f"sandfleet rl run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
                )
            summary = json.loads(summary_path.read_text())
    profile = summary["profile"]
    log("rl", f"{summary['episodes']} episodes; verdict: {profile.get('verdict', {})}")
    lease = summary["lease_seconds"]
    print(
        json.dumps(
            {
                "benchmark": "rl_loop",
                "mode": "short" if args.short else "full",
                "seconds": seconds,
                "actors": 2,
                "episodes": summary["episodes"],
                "episode_errors": len(summary["errors"]),
                "learner_steps": summary["learner_steps"],
                "lease_p50_ms": round(lease["p50"] * 1000, 2),
                "lease_p99_ms": round(lease["p99"] * 1000, 2),
                "reward_curve": summary["reward_curve"],
                "profile": profile,
            }
        )
    )


if __name__ == "__main__":
    main()
