"""Device check: the learner's torch path (`--device cuda`) on a GPU, against the numpy learner.

What `sandfleet rl learner --device cuda` does per step, without the gateway around it:
`resolve_device` and `make_policy` pick `TorchSoftmaxPolicy` on cuda for the catalogue's tasks, each
batch goes through `update` (staleness drops, truncated importance weights, REINFORCE with a
baseline), and `snapshot().to_json()` is the weight sync actors fetch. The numpy `SoftmaxPolicy`
trains on the same batches beside it; the two must agree (float64 on both). Prints progress, then
one JSON object as its last line: torch and CUDA versions, the device, the largest difference from
numpy, and the measured update and weight-sync times. Exits 1 when the two disagree, 2 when torch
or CUDA is missing (it never falls back to the CPU).

It needs only numpy and a CUDA build of torch (PyPI's `torch` is one), no gateway, no runsc:

    PYTHONPATH=operator python3 bench/torch_learner.py             # 200 steps of 64 trajectories
    PYTHONPATH=operator python3 bench/torch_learner.py --steps 50 --batch 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from sandfleet.core.profile import percentile  # noqa: E402
from sandfleet.rl.catalogue_tasks import load_tasks  # noqa: E402
from sandfleet.rl.policy import SoftmaxPolicy, Trajectory  # noqa: E402
from sandfleet.rl.torch_policy import TorchUnavailable, load_torch, make_policy, resolve_device  # noqa: E402

# The learner's defaults (sandfleet rl learner): the bound the gateway enforces, step size, clip.
STALENESS_BOUND = 4
LEARNING_RATE = 0.5
CLIP = 2.0
# float64 on both sides; exp/log on the GPU may differ from numpy's by a few ulps per step.
TOLERANCE = 1e-9


def batches(actions: dict[str, int], steps: int, size: int, seed: int) -> list[list[Trajectory]]:
    """Batches as lagging actors send them: sampled actions, rewards, some versions past the bound."""
    rng = np.random.default_rng(seed)
    behaviour = SoftmaxPolicy(actions, seed=seed)
    tasks = sorted(actions)
    out = []
    for step in range(steps):
        batch = []
        for _ in range(size):
            task = tasks[int(rng.integers(len(tasks)))]
            action, logp = behaviour.sample(task, rng)
            version = max(step - int(rng.integers(0, STALENESS_BOUND + 3)), 0)
            batch.append(Trajectory(task, action, logp, float(rng.random() < 0.5), version))
        out.append(batch)
    return out


def largest_difference(one: SoftmaxPolicy, other: SoftmaxPolicy) -> float:
    """The largest absolute logit difference between two policies over the same tasks."""
    return max(float(np.max(np.abs(one.logits[t] - other.logits[t]))) for t in one.logits)


def check(steps: int, size: int, seed: int) -> dict[str, Any]:
    """Train numpy and cuda side by side; what was measured (raises TorchUnavailable without CUDA)."""
    torch = load_torch()
    device = resolve_device("cuda", torch)
    actions = {task.id: len(task.choices) for task in load_tasks()}
    gpu = make_policy(actions, device, seed=seed, torch=torch)
    reference = SoftmaxPolicy(actions, seed=seed)
    work = batches(actions, steps, size, seed)
    print(f"{torch.cuda.get_device_name(0)}: {len(actions)} tasks, {steps} steps of {size}", file=sys.stderr)
    update_ms, sync_ms, worst, mismatched = [], [], 0.0, 0
    for batch in work:
        torch.cuda.synchronize()
        started = time.perf_counter()
        got = gpu.update(batch, STALENESS_BOUND, LEARNING_RATE, CLIP)
        torch.cuda.synchronize()
        trained = time.perf_counter()
        weights = gpu.snapshot().to_json()  # the weight sync: device to host, then the wire format
        synced = time.perf_counter()
        update_ms.append((trained - started) * 1e3)
        sync_ms.append((synced - trained) * 1e3)
        expected = reference.update(batch, STALENESS_BOUND, LEARNING_RATE, CLIP)
        if (got.used, got.dropped_stale, got.version) != (
            expected.used,
            expected.dropped_stale,
            expected.version,
        ):
            mismatched += 1
        worst = max(worst, largest_difference(SoftmaxPolicy.from_json(weights), reference))
    # The first steps include CUDA's lazy start-up (context, kernels); the percentiles show it apart.
    return {
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda),
        "device": str(torch.cuda.get_device_name(0)),
        "tasks": len(actions),
        "steps": steps,
        "batch": size,
        "version": gpu.version,
        "max_logit_difference": worst,
        "steps_disagreeing": mismatched,
        "agrees_with_numpy": mismatched == 0 and worst <= TOLERANCE,
        "update_ms": {p: percentile(update_ms, q) for p, q in (("p50", 50), ("p99", 99), ("max", 100))},
        "first_update_ms": update_ms[0],
        "weight_sync_ms": {p: percentile(sync_ms, q) for p, q in (("p50", 50), ("p99", 99))},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        result = check(args.steps, args.batch, args.seed)
    except TorchUnavailable as error:
        print(f"device check: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    if not result["agrees_with_numpy"]:
        print("device check: the cuda learner disagrees with numpy (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
