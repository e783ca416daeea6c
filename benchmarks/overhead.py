"""meshtrain's overhead: train.py vs a hand-written torch DDP loop, side by side in one run.

Both run the same GPT, data, global batch, AdamW and threads on 2 local gloo workers; runs alternate
(bare, train.py, train.py without W&B, bare, ...) so machine noise hits both. Reports the ratio of
median steady-state throughput (target >= 0.97) and of launch-to-first-step time (target <= 1.2).

    python benchmarks/overhead.py [--steps 60] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bare(steps: int) -> dict:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    launch = time.time()
    out = subprocess.run(
        [
            torchrun,
            "--nproc_per_node=2",
            "--log-dir",
            tempfile.mkdtemp(),
            str(ROOT / "benchmarks" / "bare_ddp.py"),
            f"--steps={steps}",
            f"--launch-time={launch}",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def run_meshtrain(steps: int, *extra: str) -> dict:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    launch = time.time()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            f"trainer.max_steps={steps}",
            f"trainer.log_every={steps}",
            f"hydra.run.dir={run_dir}",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["launch_to_first_step_s"] = summary["first_step_end_unix"] - launch
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    variants = {
        "hand-written DDP (torchrun)": lambda: run_bare(args.steps),
        "train.py (W&B offline)": lambda: run_meshtrain(args.steps),
        "train.py (logger=none)": lambda: run_meshtrain(args.steps, "logger=none"),
    }
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            results[name].append(fn())
    base = "hand-written DDP (torchrun)"
    base_tps = statistics.median(r["tokens_per_s"] for r in results[base])
    base_first = statistics.median(r["launch_to_first_step_s"] for r in results[base])
    print(f"{'variant':<30} {'tokens/s':>10} {'ratio':>7} {'launch→1st step':>16} {'ratio':>7}")
    for name, runs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        first = statistics.median(r["launch_to_first_step_s"] for r in runs)
        print(f"{name:<30} {tps:>10,.0f} {tps / base_tps:>7.3f} {first:>15.2f}s {first / base_first:>7.2f}")


if __name__ == "__main__":
    main()
