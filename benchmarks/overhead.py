"""meshtrain's overhead: ``python train.py`` against a hand-written torch loop, strategy by strategy.

Each pair trains the same model (``--model``: gpt_small, llama_debug or qwen3_debug; the expert-parallel pair
the MoEs qwen3_moe_debug and deepseek_v3_debug), byte data, global batch, AdamW, clipping and thread count;
the hand-written side (``benchmarks/bare_*.py``, plain torch) is started as a torch user starts it,
``torchrun --nproc_per_node=N script.py``, and meshtrain as its user starts it, ``python train.py
parallel=...`` (its launcher forks the workers on CPU: ``topology.start_method=auto``), both from a new
interpreter. Rounds alternate the order inside each pair (bare first, then meshtrain first, ...) so machine
noise hits both. Per strategy: the median (and range) over rounds of each round's ratio meshtrain / bare of
median steady-state tokens/s (steps 3 on, as each side times its steps), of the end-to-end rate of steps 2
on (all the loop's time after step 1: logging and between-step measurement included), and of the time from
launch to the end of step 1 (split below the table into the start, launch to the loop, and step 1 itself,
beside the CPU seconds of each whole run and of a steady step); the step-1 losses side by side (the same
seed, model and batch: they should agree to about 1e-6).

    python benchmarks/overhead.py --strategy all            # every pair, 3 rounds of 40 steps
    python benchmarks/overhead.py --strategy tp --rounds 5 --overrides tp.measure_comm=false
    python benchmarks/overhead.py --strategy all --control   # the hand-written loop on both sides
    python benchmarks/overhead.py --strategy all --model llama_debug   # the decoders: llama_debug, qwen3_debug
    python benchmarks/overhead.py --strategy ep --model qwen3_moe_debug  # expert parallel, dp=2 x ep=2
    python benchmarks/overhead.py --strategy ep --model deepseek_v3_debug  # the same with MLA, shared experts

``--control`` runs the hand-written loop in meshtrain's place too: the ratios two identical runs show on this
machine, the noise any meshtrain / hand-written ratio carries (the "meshtrain" columns are then the second
hand-written run).

Targets: tokens/s ratio >= 1.0 and time-to-first-step ratio <= 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pair:
    """One strategy: its hand-written loop, its ranks, and the train.py overrides that run the same layout."""

    script: str
    nproc: int
    overrides: tuple[str, ...]
    describe: str
    models: tuple[str, ...] = ()
    """``--model`` names the pair runs: the dense ``MODELS`` when empty."""
    shrinks: bool = False
    """``--nproc 1`` runs it on one rank (its one dimension at size 1)."""


PAIRS = {
    "ddp": Pair("bare_ddp.py", 2, ("parallel=ddp",), "DDP, dp=2", shrinks=True),
    "fsdp": Pair("bare_fsdp.py", 2, ("parallel=fsdp",), "FSDP2, dp=2", shrinks=True),
    "tp": Pair("bare_tp.py", 2, ("parallel=tp",), "tensor parallel, tp=2", shrinks=True),
    "pp": Pair("bare_pp.py", 2, ("parallel=pp",), "pipeline 1F1B, pp=2, 4 micro-batches", shrinks=True),
    "hybrid": Pair(
        "bare_hybrid.py", 4, ("parallel=hybrid", "tp.size=1"), "hybrid dp=2 x pp=2 (FSDP2 + 1F1B, 4 micro-batches)"
    ),
    "ep": Pair(
        "bare_ep.py",
        2,
        ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1"),
        "expert parallel dp=2 x ep=2 (all-to-all dispatch, FSDP2)",
        models=("qwen3_moe_debug", "deepseek_v3_debug"),
    ),
}


MODELS = ("gpt_small", "llama_debug", "qwen3_debug")
"""``--model``: the dense conf/model names that ``benchmarks/bare_common.py`` builds the same way (every pair but
the MoE ones runs them)."""


def pair_models(pair: Pair) -> tuple[str, ...]:
    return pair.models or MODELS


def strategies_for(strategy: str, model: str) -> list[str]:
    """The pairs ``--strategy`` names that run ``--model`` (``all``: every pair that runs it); a pair asked for a
    model it does not run is refused before anything runs."""
    if strategy == "all":
        return [name for name, pair in PAIRS.items() if model in pair_models(pair)]
    if model not in pair_models(PAIRS[strategy]):
        raise SystemExit(
            f"--strategy {strategy} --model {model}: the {strategy} pair runs --model "
            f"{' or '.join(pair_models(PAIRS[strategy]))}"
            + (" (expert parallel needs a mixture-of-experts model)" if PAIRS[strategy].models else "")
        )
    return [strategy]


def run_bare(pair: Pair, *, steps: int, batch: int, seq: int, device: str, nproc: int, model: str) -> dict:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    with tempfile.TemporaryDirectory(prefix="bench_bare_") as logs:
        launch = time.time()
        out = subprocess.run(
            [
                torchrun,
                f"--nproc_per_node={nproc}",
                "--log-dir",
                logs,
                str(ROOT / "benchmarks" / pair.script),
                f"--steps={steps}",
                f"--batch={batch}",
                f"--seq={seq}",
                f"--launch-time={launch}",
                f"--device={device}",
                f"--model={model}",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{pair.script} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(lines[-1])
    return {**result, "step_cpu_s": sum(result["median_step_cpu_s_per_rank"])}


def run_meshtrain(
    pair: Pair, *, steps: int, batch: int, seq: int, device: str, nproc: int, model: str, extra: list[str]
) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_meshtrain_") as tmp:
        run_dir = Path(tmp) / "run"
        launch = time.time()
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                *pair.overrides,
                f"model={model}",
                f"trainer.max_steps={steps}",
                "trainer.checkpoint_every=0",
                f"data.global_batch_size={batch}",
                f"data.seq_len={seq}",
                f"hydra.run.dir={run_dir}",
                *layout_overrides(pair, device=device, nproc=nproc),
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "WANDB_SILENT": "true"},
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"train.py {' '.join(pair.overrides)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}"
            )
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "tokens_per_s": summary["tokens_per_s"],
        "launch_to_first_step_s": summary["first_step_end_unix"] - launch,
        "first_step_s": summary["fit_to_first_step_s"],
        # every second of the loop after step 1, logged steps and per-step measurements included
        "end_to_end_tokens_per_s": batch
        * seq
        * (steps - 1)
        / (summary["wall_time_s"] - summary["fit_to_first_step_s"]),
        "first_loss": summary["first_loss"],
        "step_cpu_s": sum(summary["median_step_cpu_s_per_rank"]),
        "median_step_cpu_s_per_rank": summary["median_step_cpu_s_per_rank"],
    }


def layout_overrides(pair: Pair, *, device: str, nproc: int) -> list[str]:
    """train.py overrides for another device or rank count than the pair's own: on CUDA the topology's device
    (NCCL follows); with fewer ranks the dimension the pair's parallelism spreads over shrinks to fit."""
    out = [] if device == "cpu" else [f"topology.device={device}"]
    if nproc != pair.nproc:
        if not pair.shrinks or nproc != 1:
            raise SystemExit(
                f"--nproc {nproc} for {pair.describe}: only a 2-rank pair of one dimension "
                f"({', '.join(n for n, p in PAIRS.items() if p.shrinks)}) shrinks, to 1 rank (one device); this one "
                f"runs on its own {pair.nproc}"
            )
        out += [f"{dim}.size=1" for dim in ("dp", "tp", "pp")]
    return out


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every waited-for descendant so far: a run's cost that load does not
    inflate the way it inflates wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", choices=[*PAIRS, "all"], default="all")
    ap.add_argument(
        "--model",
        choices=list(dict.fromkeys(m for p in PAIRS.values() for m in pair_models(p))),
        default=None,
        help="gpt_small by default; qwen3_moe_debug (the default of --strategy ep) or deepseek_v3_debug for the expert-parallel pair only",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--overrides", nargs="*", default=[], help="extra train.py overrides (meshtrain side)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank")
    ap.add_argument(
        "--control", action="store_true", help="the hand-written loop on both sides: the noise floor of a ratio"
    )
    ap.add_argument(
        "--nproc", type=int, default=None, help="ranks per run instead of the pair's own (1: one GPU, ddp/fsdp)"
    )
    args = ap.parse_args(argv)
    if args.model is None:
        args.model = (
            PAIRS[args.strategy].models[0] if args.strategy in PAIRS and PAIRS[args.strategy].models else "gpt_small"
        )
    names = strategies_for(args.strategy, args.model)
    for name in names:  # an unsupported --nproc is refused before anything runs
        layout_overrides(PAIRS[name], device=args.device, nproc=args.nproc or PAIRS[name].nproc)
    shape = {"steps": args.steps, "batch": args.batch, "seq": args.seq, "model": args.model}
    got: dict[str, dict[str, list[dict]]] = {n: {"bare": [], "meshtrain": []} for n in names}
    load_before, started = loadavg(), time.perf_counter()
    for r in range(args.rounds):
        for name in names:
            pair = PAIRS[name]
            where = {"device": args.device, "nproc": args.nproc or pair.nproc}
            sides = ("bare", "meshtrain") if r % 2 == 0 else ("meshtrain", "bare")
            for side in sides:
                cpu = children_cpu_s()
                if side == "bare" or args.control:
                    result = run_bare(pair, **shape, **where)
                else:
                    result = run_meshtrain(pair, **shape, **where, extra=args.overrides)
                got[name][side].append({**result, "cpu_s": children_cpu_s() - cpu})
            b, m = got[name]["bare"][-1], got[name]["meshtrain"][-1]
            print(
                f"[round {r + 1}/{args.rounds}, {time.perf_counter() - started:.0f} s] {name}: "
                f"tokens/s {m['tokens_per_s']:,.0f} / {b['tokens_per_s']:,.0f}, "
                f"first step {m['launch_to_first_step_s']:.2f} s / {b['launch_to_first_step_s']:.2f} s "
                f"(meshtrain / bare; load {loadavg()})",
                flush=True,
            )
    print(f"\nload average before: {load_before}; after: {loadavg()}; {time.perf_counter() - started:.0f} s in all")
    print(
        f"{args.model}: {args.rounds} rounds of {args.steps} steps, global batch {args.batch} x {args.seq} tokens, 1 thread per rank, "
        f"{args.device}"
        + (f", {args.nproc} rank(s) per run" if args.nproc else "")
        + (f"; train.py overrides: {' '.join(args.overrides)}" if args.overrides else "")
        + (
            "; CONTROL: the hand-written loop on both sides (the meshtrain columns are its second run)"
            if args.control
            else ""
        )
    )
    print(
        "\n| strategy | tokens/s bare | tokens/s meshtrain | tokens/s ratio | first step bare | "
        "first step meshtrain | first-step ratio | end-to-end tokens/s ratio | step-1 loss bare / meshtrain |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    targets = []
    for name in names:
        bare, mesh = got[name]["bare"], got[name]["meshtrain"]
        tps = [m["tokens_per_s"] / b["tokens_per_s"] for b, m in zip(bare, mesh)]
        first = [m["launch_to_first_step_s"] / b["launch_to_first_step_s"] for b, m in zip(bare, mesh)]
        e2e = [m["end_to_end_tokens_per_s"] / b["end_to_end_tokens_per_s"] for b, m in zip(bare, mesh)]
        print(
            f"| {PAIRS[name].describe if not args.nproc else f'{name}, {args.nproc} rank(s)'} | {spread([b['tokens_per_s'] for b in bare], ',.0f')} "
            f"| {spread([m['tokens_per_s'] for m in mesh], ',.0f')} | {spread(tps, '.3f')} "
            f"| {spread([b['launch_to_first_step_s'] for b in bare], '.2f')} s "
            f"| {spread([m['launch_to_first_step_s'] for m in mesh], '.2f')} s | {spread(first, '.2f')} "
            f"| {spread(e2e, '.3f')} "
            f"| {bare[0]['first_loss']:.6f} / {mesh[0]['first_loss']:.6f} |"
        )
        targets.append(
            f"- {name}: tokens/s ratio {statistics.median(tps):.3f} >= 1.0 "
            f"{'met' if statistics.median(tps) >= 1.0 else 'missed'}; first-step ratio "
            f"{statistics.median(first):.2f} <= 1.0 {'met' if statistics.median(first) <= 1.0 else 'missed'} "
            f"(end-to-end tokens/s ratio {statistics.median(e2e):.3f})"
        )
    print(
        "\nTime to first step, split (medians): launch to the loop's start, then step 1 itself; the CPU "
        "seconds each whole run used (all its processes; load does not inflate them as it does wall time); and "
        "the CPU milliseconds of a steady step (each rank's process median, summed over the ranks), with the "
        "ratio meshtrain / bare per round: the host work a step costs, apart from waiting"
    )
    print(
        "\n| strategy | start bare | start meshtrain | step 1 bare | step 1 meshtrain | CPU s per run bare "
        "| CPU s per run meshtrain | CPU ms per step bare | CPU ms per step meshtrain | CPU-per-step ratio |"
        "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name in names:
        start = {k: [r["launch_to_first_step_s"] - r["first_step_s"] for r in v] for k, v in got[name].items()}
        step1 = {k: [r["first_step_s"] for r in v] for k, v in got[name].items()}
        print(
            f"| {name} | {statistics.median(start['bare']):.2f} s | {statistics.median(start['meshtrain']):.2f} s "
            f"| {statistics.median(step1['bare']):.2f} s | {statistics.median(step1['meshtrain']):.2f} s "
            f"| {spread([r['cpu_s'] for r in got[name]['bare']], '.1f')} "
            f"| {spread([r['cpu_s'] for r in got[name]['meshtrain']], '.1f')} "
            f"| {spread([r['step_cpu_s'] * 1e3 for r in got[name]['bare']], '.1f')} "
            f"| {spread([r['step_cpu_s'] * 1e3 for r in got[name]['meshtrain']], '.1f')} "
            f"| {spread([m['step_cpu_s'] / b['step_cpu_s'] for b, m in zip(got[name]['bare'], got[name]['meshtrain'])], '.3f')} |"
        )
    print("\nTargets (medians over rounds):")
    print("\n".join(targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
