"""Start-up of ``python train.py``: the workers forked from the launcher (``topology.start_method=fork``, the
default on CPU) against spawned ones (``spawn``, the CUDA default), side by side.

Each round runs the same short job once per start method, alternating, as a user starts it (a new interpreter);
it prints the median and range of the wall time from the shell to the process's exit and to the end of the first
training step (the run's own ``first_step_end_unix``), the load average beside them, and the ratio.

    python benchmarks/startup.py                       # parallel=ddp (2 ranks), 5 rounds
    python benchmarks/startup.py --rounds 3 parallel=hybrid pp.micro_batches=4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ("trainer.max_steps=3", "trainer.log_every=1", "logger=none", "data.seq_len=32", "data.global_batch_size=8")
METHODS = ("fork", "spawn")


def one_run(method: str, overrides: list[str], run_dir: Path) -> dict[str, float]:
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, *JOB, f"topology.start_method={method}"]
    env = {**os.environ, "WANDB_SILENT": "true"}
    t0 = time.time()
    subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], check=True, capture_output=True, cwd=ROOT, env=env)
    wall = time.time() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "first_step_s": summary["first_step_end_unix"] - t0}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("overrides", nargs="*", default=["parallel=ddp"])
    args = ap.parse_args(argv)
    got: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        for r in range(args.rounds):
            for method in METHODS if r % 2 == 0 else METHODS[::-1]:
                got[method].append(one_run(method, args.overrides, Path(tmp) / f"{method}{r}"))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"`python train.py {' '.join(args.overrides)}` ({len(JOB)} short-job overrides), {args.rounds} rounds")
    print("| start method | shell to first step end | shell to exit |\n|---|---|---|")
    for method in METHODS:
        rows = got[method]
        print(f"| {method} | {spread([r['first_step_s'] for r in rows])} | {spread([r['wall_s'] for r in rows])} |")
    med = {m: statistics.median(r["first_step_s"] for r in got[m]) for m in METHODS}
    print(f"fork / spawn, time to first step: {med['fork'] / med['spawn']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
