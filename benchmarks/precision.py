"""Precision x activation checkpointing x compile on CPU: tokens/s, saved activations, memory, MFU per run.

Each combination is one ``python train.py`` run (2 gloo ranks, the model and batch below); the row is read
back from its summary.json: median tokens/s and MFU over the steady steps, the peak of saved activations
(bytes autograd and checkpointing keep for backward, largest rank), peak resident memory (largest rank),
compile time and first-step time. Prints a markdown table (and the load average, since CPU timings move
with it).

    python benchmarks/precision.py                       # ddp and pp, every combination
    python benchmarks/precision.py --strategies ddp --compile false --steps 10
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {
    "ddp": ("parallel=ddp",),
    "pp": ("parallel=pp", "pp.size=2", "pp.micro_batches=4", "pp.trace_step=0"),
}


def run_one(overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama_debug")
    parser.add_argument("--strategies", default="ddp,pp")
    parser.add_argument("--precision", default="fp32,bf16-mixed")
    parser.add_argument("--ac", default="none,selective,full")
    parser.add_argument("--compile", default="false,true")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    common = [
        f"model={args.model}",
        f"data.seq_len={args.seq_len}",
        f"data.global_batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every=1",
        "trainer.checkpoint_every=0",
        "logger=none",
    ]
    print(
        f"model={args.model}, global batch {args.batch} x {args.seq_len} tokens, {args.steps} steps, 2 gloo ranks "
        f"(1 thread each); load average before: {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(
        "| strategy | precision | AC | compile | tokens/s | MFU | peak saved activations (MiB) | peak RSS (MiB) "
        "| compile s | first step s | final loss |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    grid = itertools.product(
        args.strategies.split(","), args.precision.split(","), args.compile.split(","), args.ac.split(",")
    )
    with tempfile.TemporaryDirectory(prefix="precision_bench_") as tmp:
        for i, (strategy, precision, compile_, ac) in enumerate(grid):
            overrides = [
                *common,
                *STRATEGIES[strategy],
                f"trainer.precision={precision}",
                f"trainer.activation_checkpointing={ac}",
                f"trainer.compile={compile_}",
            ]
            t0 = time.time()
            s = run_one(overrides, Path(tmp) / str(i))
            compile_s = f"{s['compile_time_s']:.1f}" if s.get("compile_time_s") is not None else "-"
            print(
                f"| {strategy} | {precision} | {ac} | {compile_} | {s['tokens_per_s']:,.0f} | {s['mfu']:.2%} | "
                f"{s['peak_saved_activation_bytes_max'] / 2**20:.2f} | {s['peak_memory_bytes_max'] / 2**20:.0f} | "
                f"{compile_s} | {s['first_step_time_s']:.2f} | {s['final_loss']:.4f} |",
                flush=True,
            )
            print(f"<!-- {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f} -->", file=sys.stderr, flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
