"""Planner vs measurement on this machine: predicted and measured step times of a small local sweep.

``python benchmarks/planner.py [--steps N] [--write]`` calibrates this machine (``topology.calibrate``),
asks the planner to rank the layouts this checkout can train, trains each layout of the sweep for a few
steps with train.py, and prints predicted vs measured step time per layout and whether the planner's first
choice is within 10% of the best measured one. ``--write`` puts the table in docs/benchmarks.md under
"## Planner". ``tests/integration/test_planner_vs_measured_steps.py`` drives the same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel.plan.cli import CONF, compose  # noqa: E402
from parallel.plan.cost_model import Candidate, estimate  # noqa: E402
from parallel.plan.search import available_strategies, describe, plan, specs_from_cfg  # noqa: E402
from parallel.plan.specs import HardwareSpec  # noqa: E402

BASE = ("model=gpt_small", "logger=none", "data.seq_len=64", "trainer.log_every=100")


@dataclass(frozen=True)
class Layout:
    label: str
    overrides: tuple[str, ...]
    candidate: Candidate
    global_batch_size: int


def layout_of(c: Candidate, *, global_batch_size: int) -> Layout:
    """The train.py overrides that run candidate ``c`` (non-pipelined strategies: single, ddp, fsdp)."""
    name = {1: "single"}.get(c.dp, "fsdp" if c.zero_stage == 3 else "ddp")
    per_replica = global_batch_size // c.dp
    mbs = (
        f"data.micro_batch_size={per_replica // c.micro_batches}"
        if c.micro_batches > 1
        else "data.micro_batch_size=null"
    )
    ov = (f"parallel={name}", f"dp.size={c.dp}", f"data.global_batch_size={global_batch_size}", mbs)
    return Layout(f"{describe(c)} B={global_batch_size}", ov, c, global_batch_size)


#: six layouts with the strategies every checkout has (single, ddp): degrees, micro-batches and batch vary
SWEEP = (
    layout_of(Candidate(dp=1, micro_batches=1), global_batch_size=16),
    layout_of(Candidate(dp=1, micro_batches=4), global_batch_size=16),
    layout_of(Candidate(dp=2, micro_batches=1), global_batch_size=16),
    layout_of(Candidate(dp=2, micro_batches=4), global_batch_size=16),
    layout_of(Candidate(dp=1, micro_batches=1), global_batch_size=32),
    layout_of(Candidate(dp=2, micro_batches=2), global_batch_size=32),
)


def calibrated(global_batch_size: int = 16) -> HardwareSpec:
    cfg = compose([*BASE, f"data.global_batch_size={global_batch_size}", "topology.calibrate=true"])
    return specs_from_cfg(cfg)[1]


def predict(layout: Layout, hardware: HardwareSpec) -> float:
    cfg = compose([*BASE, f"data.global_batch_size={layout.global_batch_size}"])
    model, _, workload = specs_from_cfg(cfg, calibrate=False)
    return estimate(layout.candidate, model=model, hardware=hardware, workload=workload).step_time_s


def measure(layout: Layout, *, steps: int, run_dir: Path) -> float:
    """Median step time (warm-up excluded) of a real train.py run."""
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *BASE,
        *layout.overrides,
        f"trainer.max_steps={steps}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{layout.label} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(json.loads((run_dir / "summary.json").read_text())["median_step_time_s"])


def sweep(layouts=SWEEP, *, steps: int = 12, hardware: HardwareSpec | None = None) -> list[dict]:
    hardware = hardware or calibrated()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, lay in enumerate(layouts):
            measured = measure(lay, steps=steps, run_dir=Path(tmp) / str(i))
            predicted = predict(lay, hardware)
            rows.append(
                {
                    "layout": lay.label,
                    "predicted_s": predicted,
                    "measured_s": measured,
                    "error": predicted / measured - 1,
                }
            )
    return rows


def first_choice(hardware: HardwareSpec, global_batch_size: int = 16) -> Candidate:
    cfg = compose([*BASE, f"data.global_batch_size={global_batch_size}"])
    model, _, workload = specs_from_cfg(cfg, calibrate=False)
    allowed = [s for s in available_strategies(CONF) if s in ("single", "ddp", "fsdp")]
    return plan(model=model, hardware=hardware, workload=workload, allowed=allowed).best.candidate


def markdown(rows: list[dict], *, choice: str, choice_s: float, best: dict, steps: int) -> str:
    lines = [
        "## Planner",
        "",
        f"`python benchmarks/planner.py --write` on this machine (gpt_small, seq 64, {steps} steps per layout, "
        "median step time after 2 warm-up steps; `topology.calibrate=true` measured FLOP/s, per-micro-batch "
        "overhead, AdamW bandwidth and gloo all-reduce/p2p first). The sweep uses single and ddp only "
        "(pipeline and TP layouts are not in it yet), so the six layouts vary dp, micro-batches and batch size.",
        "",
        "| layout | predicted s | measured s | error |",
        "|---|---:|---:|---:|",
        *[f"| {r['layout']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | {r['error']:+.0%} |" for r in rows],
        "",
        f"Planner's first choice (batch 16): **{choice}**, measured {choice_s:.4f} s; best measured at batch 16: "
        f"{best['layout']} {best['measured_s']:.4f} s → the choice is {choice_s / best['measured_s'] - 1:+.0%} from the best "
        "(target: within 10%).",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str, path: Path = ROOT / "docs" / "benchmarks.md") -> None:
    """Replace (or append) the "## Planner" section, leaving other sections alone."""
    old = path.read_text() if path.exists() else "# Benchmarks\n\n"
    start = old.find("## Planner")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        old = old[:start] + (old[end + 1 :] if end >= 0 else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(old.rstrip("\n") + "\n\n" + text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args(argv)
    hardware = calibrated()
    print("measured:", json.dumps(hardware.measured))
    rows = sweep(steps=args.steps, hardware=hardware)
    choice = first_choice(hardware)
    chosen = layout_of(choice, global_batch_size=16)
    match = [r for r, lay in zip(rows, SWEEP) if lay.overrides == chosen.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        choice_s = match[0]["measured_s"] if match else measure(chosen, steps=args.steps, run_dir=Path(tmp))
    best = min((r for r, lay in zip(rows, SWEEP) if lay.global_batch_size == 16), key=lambda r: r["measured_s"])
    text = markdown(rows, choice=chosen.label, choice_s=choice_s, best=best, steps=args.steps)
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
