"""Planner vs measurement on this machine: every local layout's predicted and measured step time and memory.

``python benchmarks/planner.py [--steps N] [--write] [--quick]`` calibrates this machine
(``topology.calibrate=true``: FLOP/s, per-micro-batch cost, AdamW bandwidth, gloo all-reduce and p2p, a
pipeline action's and a tensor-parallel collective's fixed cost), then trains every layout of the sweep for a
few steps with train.py: single, ddp, fsdp, mp, tp, pp under gpipe / 1f1b / interleaved_1f1b / zbv at
m = 1, 2, 4, 8 where the schedule accepts it, and the 4-worker hybrids. It prints predicted vs measured median
step time and memory per layout, the median and worst error, and whether the planner's first choice among
these layouts is within 10% of the best measured one (the choice's own measured time, not the best's).
``--write`` puts the table in docs/benchmarks.md under "## Planner".
``tests/integration/test_planner_vs_measured_steps.py`` drives the same functions on ``QUICK``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel.plan.cli import compose  # noqa: E402
from parallel.plan.cost_model import Candidate, estimate  # noqa: E402
from parallel.plan.search import describe, specs_from_cfg, strategy_of  # noqa: E402
from parallel.plan.specs import HardwareSpec  # noqa: E402

BASE = ("model=gpt_small", "logger=none", "data.seq_len=64", "trainer.log_every=100", "trainer.checkpoint_every=0")
BATCH = 16
MIB = 2**20


@dataclass(frozen=True)
class Layout:
    label: str
    overrides: tuple[str, ...]
    candidate: Candidate


def layout_of(c: Candidate, *, global_batch_size: int = BATCH) -> Layout:
    """The train.py overrides that run candidate ``c``, whatever its strategy."""
    name = strategy_of(c)
    ov = [f"parallel={name}", f"dp.size={c.dp}", f"tp.size={c.tp}", f"pp.size={c.pp}"]
    ov.append(f"data.global_batch_size={global_batch_size}")
    if c.pp > 1:
        ov += [
            f"pp.micro_batches={c.micro_batches}",
            f"pp.schedule={c.schedule}",
            f"pp.stages_per_rank={c.stages_per_rank}",
            "pp.trace_step=0",
            "data.micro_batch_size=null",
        ]
    else:
        per_replica = global_batch_size // c.dp
        mbs = per_replica // c.micro_batches if c.micro_batches > 1 else None
        ov.append(f"data.micro_batch_size={mbs if mbs else 'null'}")
    if name == "hybrid":
        ov.append(f"dp.shard={'true' if c.zero_stage == 3 else 'false'}")
    if c.tp > 1:
        ov.append(f"tp.sequence_parallel={'true' if c.sequence_parallel else 'false'}")
    return Layout(describe(c), tuple(ov), c)


def _pp(schedule: str, m: int, v: int = 1, **kw) -> Candidate:
    return Candidate(pp=2, micro_batches=m, schedule=schedule, stages_per_rank=v, **kw)


#: every local layout: 1-, 2- and 4-worker, all strategies, the schedules at the micro-batch counts they accept
SWEEP = tuple(
    layout_of(c)
    for c in (
        Candidate(),
        Candidate(micro_batches=4),
        Candidate(dp=2),
        Candidate(dp=2, zero_stage=3),
        Candidate(tp=2),
        _pp("gpipe", 1),  # parallel=mp
        *(_pp("gpipe", m) for m in (2, 4, 8)),
        *(_pp("1f1b", m) for m in (2, 4, 8)),
        *(_pp("interleaved_1f1b", m, 2) for m in (2, 4, 8)),
        *(_pp("zbv", m, 2) for m in (4, 8)),
        Candidate(dp=2, pp=2, micro_batches=4, schedule="1f1b", zero_stage=3),
        Candidate(tp=2, pp=2, micro_batches=4, schedule="1f1b"),
        Candidate(dp=2, tp=2, zero_stage=3),
    )
)
#: one layout per strategy family, for the test
QUICK = tuple(
    layout_of(c)
    for c in (
        Candidate(),
        Candidate(dp=2),
        Candidate(dp=2, zero_stage=3),
        Candidate(tp=2),
        _pp("gpipe", 1),
        _pp("1f1b", 4),
    )
)


def calibrated() -> HardwareSpec:
    cfg = compose([*BASE, f"data.global_batch_size={BATCH}", "topology.calibrate=true"])
    return specs_from_cfg(cfg)[1]


def _hardware_for(c: Candidate, hardware: HardwareSpec) -> HardwareSpec:
    """A layout with more ranks than the preset's devices runs them all on this node (sharing its cores)."""
    return replace(hardware, devices_per_node=max(hardware.devices_per_node, c.world_size))


def predict(layout: Layout, hardware: HardwareSpec) -> dict[str, float]:
    cfg = compose([*BASE, *layout.overrides])
    model, _, workload = specs_from_cfg(cfg, calibrate=False)
    est = estimate(layout.candidate, model=model, hardware=_hardware_for(layout.candidate, hardware), workload=workload)
    return {
        "step_s": est.step_time_s,
        "memory_bytes": est.memory.total,
        "model_state_bytes": est.memory.params + est.memory.grads + est.memory.optimizer,
    }


def train_cold(overrides: list[str], run_dir: Path) -> None:
    """``python train.py OVERRIDES hydra.run.dir=RUN_DIR`` in a new interpreter, as a user starts it."""
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def measure(layout: Layout, *, steps: int, run_dir: Path, train=train_cold) -> dict[str, float]:
    """Median step time (warm-up excluded) and memory of a real train.py run (``train(overrides, run_dir)``)."""
    train([*BASE, *layout.overrides, f"trainer.max_steps={steps}"], run_dir)
    s = json.loads((run_dir / "summary.json").read_text())
    state = max(r["model_state"] for r in s["model_state_bytes_per_rank"])
    activations = (s.get("pipeline") or {}).get("stages") or []
    peak_act = max((r.get("peak_activation_bytes") or 0 for r in activations), default=0)
    return {
        "step_s": float(s["median_step_time_s"]),
        "model_state_bytes": float(state),
        "memory_bytes": float(state + peak_act),
        "peak_rss_bytes": float(s["peak_memory_bytes_max"]),
    }


def sweep(layouts=SWEEP, *, steps: int = 12, hardware: HardwareSpec | None = None, train=train_cold) -> list[dict]:
    hardware = hardware or calibrated()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, lay in enumerate(layouts):
            got = measure(lay, steps=steps, run_dir=Path(tmp) / str(i), train=train)
            pred = predict(lay, hardware)
            rows.append(
                {"layout": lay.label, "predicted": pred, "measured": got, "error": pred["step_s"] / got["step_s"] - 1}
            )
            print(
                f"{lay.label}: predicted {pred['step_s']:.4f} s, measured {got['step_s']:.4f} s "
                f"({rows[-1]['error']:+.0%})",
                flush=True,
            )
    return rows


def first_choice(rows: list[dict], layouts) -> tuple[dict, dict]:
    """(the planner's first choice among ``layouts``: fastest predicted, the fastest measured); both rows."""
    assert [r["layout"] for r in rows] == [lay.label for lay in layouts]
    choice = min(rows, key=lambda r: r["predicted"]["step_s"])
    best = min(rows, key=lambda r: r["measured"]["step_s"])
    return choice, best


def summary_of(rows: list[dict], layouts) -> dict[str, float]:
    errors = [abs(r["error"]) for r in rows]
    choice, best = first_choice(rows, layouts)
    return {
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "choice_vs_best": choice["measured"]["step_s"] / best["measured"]["step_s"] - 1,
        "choice": choice["layout"],
        "best": best["layout"],
    }


def markdown(rows: list[dict], *, layouts, steps: int, hardware: HardwareSpec) -> str:
    s = summary_of(rows, layouts)
    worst = max(rows, key=lambda r: abs(r["error"]))
    measured = ", ".join(f"{k}={v:.3g}" for k, v in hardware.measured.items())
    lines = [
        "## Planner",
        "",
        f"`python benchmarks/planner.py --write` on this machine (gpt_small, batch {BATCH} x seq 64, {steps} steps "
        "per layout, median step time after the warm-up; calibrated first: " + measured + "). Memory: the "
        "predicted fullest rank (model state + activations) beside the measured largest model state (local "
        "shards) plus, for pipelines, the stage's measured peak saved activations; peak RSS for scale.",
        "",
        "| layout | predicted s | measured s | error | predicted MiB | measured MiB | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['layout']} | {r['predicted']['step_s']:.4f} | {r['measured']['step_s']:.4f} | {r['error']:+.0%} | "
            f"{r['predicted']['memory_bytes'] / MIB:.1f} | {r['measured']['memory_bytes'] / MIB:.1f} | "
            f"{r['measured']['peak_rss_bytes'] / MIB:.0f} |"
            for r in rows
        ],
        "",
        f"Step time error over {len(rows)} layouts: median {s['median_abs_error']:.0%} (target ≤ 15%), worst "
        f"{s['worst_abs_error']:.0%} ({worst['layout']}; target ≤ 30%). The planner's first choice among them, "
        f"**{s['choice']}**, measured {s['choice_vs_best']:+.0%} from the best measured layout ({s['best']}; "
        "target: within 10%).",
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
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="one layout per strategy family (QUICK)")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args(argv)
    layouts = QUICK if args.quick else SWEEP
    hardware = calibrated()
    print("measured:", json.dumps(hardware.measured))
    rows = sweep(layouts, steps=args.steps, hardware=hardware)
    text = markdown(rows, layouts=layouts, steps=args.steps, hardware=hardware)
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
