"""Planner vs measurement on this machine: every local layout's predicted and measured step time and memory.

``python benchmarks/planner.py [--steps N] [--calibrations K] [--rounds R] [--write] [--quick]`` calibrates this
machine K times, keeping each quantity's median (``topology.calibrate=true``: FLOP/s, per-micro-batch cost,
AdamW bandwidth, gloo all-reduce and p2p, the fixed costs of a pipeline action, a TP collective, an FSDP2
collective and a DDP bucket), then trains every layout of the sweep for N steps (40) with train.py, in R rounds
(3) whose median is kept: single, ddp, fsdp, mp, tp, pp under gpipe / 1f1b / interleaved_1f1b / zbv at
m = 1, 2, 4, 8 where the schedule accepts it, and the 4-worker hybrids. It prints predicted vs measured median
step time and memory per layout, the median and worst error, and whether the planner's first choice among
these layouts is within 10% of the best measured one (the choice's own measured time, not the best's).
``--write`` puts the table in docs/benchmarks.md under "## Planner". ``--ddp-parts`` instead explains the ddp
layout's step: its parts timed side by side on two gloo processes (``ddp_parts``, docs/planner.md).
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
import time
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.registry import typed_model  # noqa: E402
from parallel.foundation.intervals import IntervalLog  # noqa: E402
from parallel.plan.cli import compose, specs_from_cfg  # noqa: E402
from parallel.plan.cli import plain as plain_values  # noqa: E402
from parallel.plan.cost_model import Candidate, estimate  # noqa: E402
from parallel.plan.search import describe, strategy_of  # noqa: E402
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


def calibrated(times: int = 1) -> HardwareSpec:
    """This machine measured (``topology.calibrate=true``); ``times`` > 1: every measured quantity's median over
    that many calibrations. A fixed cost is a difference of measured step times: on this VM three calibrations within
    ten minutes solved ``ddp_bucket_us`` at 0, 3,690 and 16,164 and ``pipeline_action_ms`` at 0.55, 1.14 and 2.61."""
    cfg = compose([*BASE, f"data.global_batch_size={BATCH}", "topology.calibrate=true"])
    return median_spec([specs_from_cfg(cfg)[1] for _ in range(times)])


def median_spec(specs: list[HardwareSpec]) -> HardwareSpec:
    """One spec whose every number (links' and the ``measured`` record's included) is the median over ``specs``."""

    def median(values: list):
        first = values[0]
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            return statistics.median(values)
        if is_dataclass(first):
            return replace(first, **{f.name: median([getattr(v, f.name) for v in values]) for f in fields(first)})
        if isinstance(first, dict):
            return {k: median([v[k] for v in values]) for k in first}
        return first

    return median(specs)


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


def sweep(
    layouts=SWEEP, *, steps: int = 12, hardware: HardwareSpec | None = None, train=train_cold, rounds: int = 1
) -> list[dict]:
    """Every layout measured in ``rounds`` rounds (the order reversed every other round) and predicted; the
    measured step is the median over rounds, the memory the first round's (it does not vary). Rounds because 4
    ranks on 2 cores wait on the scheduler: four sweeps in a row measured the same hybrid at 0.17-0.23 s,
    0.29-0.46 s and 0.24-0.37 s."""
    hardware = hardware or calibrated()
    got: dict[str, list[dict]] = {lay.label: [] for lay in layouts}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for i, lay in enumerate(layouts) if r % 2 == 0 else reversed(list(enumerate(layouts))):
                got[lay.label].append(measure(lay, steps=steps, run_dir=Path(tmp) / f"{r}_{i}", train=train))
                print(
                    f"[round {r + 1}/{rounds}] {lay.label}: measured {got[lay.label][-1]['step_s']:.4f} s", flush=True
                )
    rows = []
    for lay in layouts:
        measured = {**got[lay.label][0], "step_s": statistics.median(g["step_s"] for g in got[lay.label])}
        pred = predict(lay, hardware)
        rows.append(
            {
                "layout": lay.label,
                "predicted": pred,
                "measured": measured,
                "error": pred["step_s"] / measured["step_s"] - 1,
            }
        )
        print(
            f"{lay.label}: predicted {pred['step_s']:.4f} s, measured {measured['step_s']:.4f} s "
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


def markdown(
    rows: list[dict],
    *,
    layouts,
    steps: int,
    hardware: HardwareSpec,
    load: tuple[float, float] | None = None,
    calibrations: int = 1,
    rounds: int = 1,
) -> str:
    """The "## Planner" section; ``load``: the 1-minute load average before calibrating and after the sweep (on a
    shared machine other jobs take the cores the layouts are timed on: judge the errors by it)."""
    s = summary_of(rows, layouts)
    worst = max(rows, key=lambda r: abs(r["error"]))
    measured = ", ".join(f"{k}={v:.3g}" for k, v in hardware.measured.items())
    lines = [
        "## Planner",
        "",
        f"`python benchmarks/planner.py --write` on this machine (finished {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}"
        f" UTC; gpt_small, batch {BATCH} x seq 64, {steps} steps "
        "per layout, median step time after the warm-up"
        + (f", the median over {rounds} rounds of the sweep" if rounds > 1 else "")
        + "; calibrated first"
        + (f", each quantity the median of {calibrations} calibrations" if calibrations > 1 else "")
        + ": "
        + measured
        + "). Memory: the "
        "predicted fullest rank (model state + activations) beside the measured largest model state (local "
        "shards) plus, for pipelines, the stage's measured peak saved activations; peak RSS for scale."
        + (
            f" Load average {load[0]:.1f} before calibrating, {load[1]:.1f} after the sweep ({os.cpu_count()} cores)."
            if load
            else ""
        ),
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
        f"Step time error over {len(rows)} layouts: median {s['median_abs_error']:.1%} (target ≤ 15%), worst "
        f"{s['worst_abs_error']:.1%} ({worst['layout']}; target ≤ 25%). The planner's first choice among them, "
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


#: the parts of a ddp step, each timed once per cycle in this order (a barrier before each), on both processes
DDP_PARTS = (
    "forward",
    "fb_plain",
    "fb_alone",
    "fb_ddp_no_comm",
    "fb_ddp",
    "allreduce_grads",
    "clip",
    "adamw",
    "agree",
    "step",
)


def _ddp_parts_worker(rank: int, port: int, out: str, cycles: int) -> None:
    """One of the two ranks of ``ddp_parts``: the benchmark's ddp layout (gpt_small, 8 rows of 64 per rank, one
    thread), built as parallel=ddp builds it, its parts timed in ``cycles`` rounds."""
    import gc
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from models.losses import token_cross_entropy as cross_entropy
    from parallel.foundation.grad_clip import clip_grad_norm_
    from parallel.plan.calibrate import build_family, family_kwargs

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    family, kwargs = family_kwargs(typed_model(plain_values(compose([*BASE]).model)), {})
    plain = build_family(family, kwargs)

    def no_comm_hook(state, bucket):  # the reducer's work (hooks, bucket copies) without the all-reduce
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    m = {"ddp": DDP(build_family(family, kwargs)), "no_comm": DDP(build_family(family, kwargs))}
    m["no_comm"].register_comm_hook(state=None, hook=no_comm_hook)
    timer = BucketTimer()
    m["ddp"].register_comm_hook(state=None, hook=timer.hook)
    m["opt"] = torch.optim.AdamW(m["ddp"].parameters(), lr=1e-4)
    x = torch.randint(0, int(kwargs["vocab_size"]), (BATCH // 2, 64))
    flat = torch.zeros(sum(p.numel() for p in plain.parameters()))
    flags = torch.zeros(3, dtype=torch.int32)
    exposed: list[float] = []

    def fb(model) -> None:
        model.zero_grad(set_to_none=True)
        cross_entropy(model(x), x).backward()

    def forward() -> None:
        with torch.no_grad():
            plain(x)

    def step() -> None:  # the trainer's step: zero_grad, forward + backward, clip, the agreement all-reduce, AdamW
        fb(m["ddp"])
        clip_grad_norm_(list(m["ddp"].parameters()), 1.0)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        m["opt"].step()
        exposed.append(timer.take()[0])

    parts = {
        "forward": forward,
        "fb_plain": lambda: fb(plain),
        "fb_alone": lambda: fb(plain) if rank == 0 else None,  # the other rank waits at the next barrier
        "fb_ddp_no_comm": lambda: fb(m["no_comm"]),
        "fb_ddp": lambda: (fb(m["ddp"]), timer.take()),
        "allreduce_grads": lambda: dist.all_reduce(flat),
        "clip": lambda: clip_grad_norm_(list(m["ddp"].parameters()), 1.0),
        "adamw": lambda: m["opt"].step(),
        "agree": lambda: dist.all_reduce(flags, op=dist.ReduceOp.MAX),
        "step": step,
    }
    for part in parts.values():
        part(), part()
    exposed.clear()
    times: dict[str, list[float]] = {name: [] for name in DDP_PARTS}
    for _ in range(cycles):
        for name in DDP_PARTS:
            dist.barrier()
            t0 = time.perf_counter()
            parts[name]()
            times[name].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps({**times, "bucket_allreduce_interval": exposed}))
    dist.barrier()
    parts.clear()
    m.clear()
    gc.collect()  # free the DDP modules before the group goes (docs/stack.md: teardown deadlock)
    dist.destroy_process_group()


class BucketTimer(IntervalLog):
    """[launch, completion] of every gradient bucket's all-reduce, from a Python comm hook (what ``ddp_parts``
    times; a training run reads DDP's own reducer timer instead, ``parallel/techniques/ddp.py``)."""

    def hook(self, process_group, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        start = time.perf_counter()

        def done(f):
            self.add(start, time.perf_counter())
            return f.value()

        return allreduce_hook(process_group, bucket).then(done)


def ddp_parts(cycles: int = 30) -> dict[str, float]:
    """The benchmark's ddp step taken apart, on two gloo processes of one thread: every cycle runs each part once
    (a barrier before each), so all parts meet the same load; medians in seconds, and the paired medians that
    explain the step: the busy node (both ranks' forward + backward over rank 0's alone), the reducer (DDP
    with a no-op comm hook minus the plain module), the exposed all-reduce (DDP minus the no-op hook)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "parts.json")
        mp.start_processes(_ddp_parts_worker, args=(port, out, cycles), nprocs=2, start_method="spawn", join=True)
        t = json.loads(Path(out).read_text())

    def paired(a: str, b: str, *, ratio: bool = False) -> float:
        return statistics.median(x / y if ratio else x - y for x, y in zip(t[a], t[b]))

    return {
        **{name: statistics.median(v) for name, v in t.items()},
        "busy_node": paired("fb_plain", "fb_alone", ratio=True),
        "reducer": paired("fb_ddp_no_comm", "fb_plain"),
        "exposed_allreduce": paired("fb_ddp", "fb_ddp_no_comm"),
        "step_minus_fb_plain": paired("step", "fb_plain"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per layout (the median skips the warm-up)")
    ap.add_argument("--calibrations", type=int, default=3, help="calibrations, each quantity's median kept")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the layouts, each layout's median step kept")
    ap.add_argument("--quick", action="store_true", help="one layout per strategy family (QUICK)")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--ddp-parts", type=int, metavar="CYCLES", help="explain the ddp step instead (CYCLES rounds)")
    args = ap.parse_args(argv)
    if args.ddp_parts:
        load = os.getloadavg()
        parts = ddp_parts(args.ddp_parts)
        print(f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; {args.ddp_parts} cycles")
        for name, value in parts.items():
            print(f"  {name:26s} {value:.2f}x" if name == "busy_node" else f"  {name:26s} {value * 1e3:7.1f} ms")
        return 0
    layouts = QUICK if args.quick else SWEEP
    load_before = os.getloadavg()[0]
    hardware = calibrated(args.calibrations)
    print("measured:", json.dumps(hardware.measured))
    rows = sweep(layouts, steps=args.steps, hardware=hardware, rounds=args.rounds)
    load = (load_before, os.getloadavg()[0])
    text = markdown(
        rows,
        layouts=layouts,
        steps=args.steps,
        hardware=hardware,
        load=load,
        calibrations=args.calibrations,
        rounds=args.rounds,
    )
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
