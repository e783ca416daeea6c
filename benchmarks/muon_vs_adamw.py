"""Muon against AdamW on llama_debug and qwen3_moe_debug: a learning-rate sweep, then 300 steps x 3 seeds each.

    python benchmarks/muon_vs_adamw.py [--out outputs/muon_vs_adamw] [--steps 300 ...] [--sweep-steps 100 ...]
        [--seeds 3] [--models ...] [--seq-len 64] [--batch 8] [--figure docs/img/muon_vs_adamw.png] [--jobs 2]

``--steps`` and ``--sweep-steps`` take one number for every model or one per ``--models`` entry.

1. **Sweep** (the project's own multirun, ``python train.py -m``): for each model and optimizer, ``optim.lr`` over
   ``SWEEP`` at ``--sweep-steps`` steps, seed 0, ``parallel=single``; the lr with the lowest final loss is kept
   (``optim=muon`` sweeps Muon's lr; its AdamW part keeps ``optim.adamw_lr``'s default).
2. **Runs**: the kept lr, ``--steps`` steps, ``trainer.seed=0,1,...`` (``--seeds``; one multirun per model and
   optimizer).
3. **Output** under ``--out``: ``results.json`` (every sweep point, each seed's loss at the last step, the mean and
   half their min-max range per model and optimizer, the load average and the wall time), ``results.md`` (the tables
   the docs show) and the figure at ``--figure`` (loss against step, the mean over seeds with its min-max band;
   ``docs/img/muon_vs_adamw.png`` by default, the file docs/performance.md shows).

Every job takes ``data.seq_len=--seq-len`` and ``data.global_batch_size=--batch`` (512 tokens a step by default: the
Newton-Schulz cost of a step does not shrink with the batch, the forward and backward do); everything else is each
option's default (``conf/optim/{adamw,muon}.yaml``: warm-up, cosine decay, weight decay 0). A job runs on one thread
(``topology=local_cpu``), so ``--jobs`` model-optimizer chains (sweep, then seeds) run at a time, Muon's first; each
multirun's output goes to a ``.log`` beside its folder. The load average is recorded because a loaded machine slows
it, not the losses (a seed's losses do not depend on what runs beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama_debug", "qwen3_moe_debug")
#: each optimizer's grid; a smoke run (10 steps) kept the largest of the earlier 1e-3..1e-2 and 5e-3..5e-2, so both
#: reach one step further up, and Muon two more after the 2026-12-06 run kept its top (1e-1) on both models (a
#: diverged lr stops its job, which the sweep records as nan and never keeps)
SWEEP = {"adamw": (1e-3, 3e-3, 1e-2, 3e-2), "muon": (1e-2, 2e-2, 5e-2, 1e-1, 2e-1, 4e-1)}
COMMON = ("parallel=single", "logger=none", "trainer.checkpoint_every=0", "trainer.log_every=1")


def multirun(folder: Path, *overrides: str, check: bool = True) -> list[Path]:
    """``python train.py -m OVERRIDES`` into ``folder``, its output in ``folder``.log; its job folders that completed
    (those with a summary). ``check``: a failed job stops the benchmark (the sweep lets a diverged lr fail instead)."""
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *COMMON, *overrides, f"hydra.sweep.dir={folder}"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as sink:
        code = subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "WANDB_SILENT": "true"}).returncode  # fmt: skip
    if check and code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{log.read_text()[-3000:]}")
    return sorted(p.parent for p in folder.glob("*/summary.json"))


def losses(job: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


def chosen(job: Path, key: str) -> str:
    import yaml

    picked = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    return next(o.split("=", 1)[1] for o in picked if o.startswith(f"{key}="))


def sweep(out: Path, model: str, optim: str, steps: int, data: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    lrs = [str(x) for x in SWEEP[optim]]
    jobs = multirun(out / "sweep" / model / optim, *data, f"model={model}", f"optim={optim}",
                    f"optim.lr={','.join(lrs)}", f"trainer.max_steps={steps}", "trainer.seed=0", check=False)  # fmt: skip
    finals = {lr: math.nan for lr in lrs} | {chosen(j, "optim.lr"): losses(j)[-1] for j in jobs}
    best = min(finals, key=lambda lr: finals[lr] if math.isfinite(finals[lr]) else math.inf)
    return float(best), finals


def seeds(out: Path, model: str, optim: str, lr: float, steps: int, n: int, data: tuple[str, ...]) -> list[list[float]]:
    seeds_arg = ",".join(str(s) for s in range(n))
    jobs = multirun(out / "runs" / model / optim, *data, f"model={model}", f"optim={optim}", f"optim.lr={lr}",
                    f"trainer.max_steps={steps}", f"trainer.seed={seeds_arg}")  # fmt: skip
    return [losses(j) for j in jobs]


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, model in zip(axes[0], results):
        for optim, r in results[model].items():
            curves = r["curves"]
            steps = range(1, len(curves[0]) + 1)
            mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
            ax.plot(steps, mean, label=f"{optim} (lr {r['lr']:g})")
            ax.fill_between(steps, [min(c[i] for c in curves) for i in range(len(mean))],
                            [max(c[i] for c in curves) for i in range(len(mean))], alpha=0.25)  # fmt: skip
        ax.set_title(f"{model}: {len(r['curves'])} seeds, mean and min-max")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def tables(results: dict, load: dict) -> str:
    lines = [f"load average before {load['before']}, after {load['after']}; {load['wall_s']:.0f} s", ""]
    lines += ["| model | optimizer | swept lr: final loss | kept lr | steps x seeds (sweep steps) | loss at the last step: mean ± half the min-max range over seeds |", "|---|---|---|---:|---|---|"]  # fmt: skip
    for model, by_optim in results.items():
        for optim, r in by_optim.items():
            swept = ", ".join(f"{lr}: {v:.4f}" for lr, v in r["sweep"].items())
            last = [c[-1] for c in r["curves"]]
            lines.append(f"| {model} | {optim} | {swept} | {r['lr']:g} | {len(r['curves'][0])} x {len(last)} "
                         f"({r['sweep_steps']}) | {statistics.fmean(last):.4f} "
                         f"(± {(max(last) - min(last)) / 2:.4f}) |")  # fmt: skip
    return "\n".join(lines) + "\n"


def per_model(parser: argparse.ArgumentParser, models: list[str], flag: str, values: list[int]) -> dict[str, int]:
    """One value for every model, or one per model in ``--models``' order."""
    if len(values) not in (1, len(models)):
        parser.error(f"{flag} {' '.join(map(str, values))}: give one number or one per model ({len(models)})")
    return dict(zip(models, values * len(models) if len(values) == 1 else values))


def chain(out: Path, model: str, optim: str, sweep_steps: int, steps: int, n: int, data: tuple[str, ...]) -> dict:
    """One model and optimizer: the sweep, then ``n`` seeds at the kept lr."""
    lr, finals = sweep(out, model, optim, sweep_steps, data)
    curves = seeds(out, model, optim, lr, steps, n, data)
    print(f"{model} {optim}: lr {lr:g} kept, {len(curves)} seeds done", flush=True)
    return {"lr": lr, "sweep": finals, "sweep_steps": sweep_steps, "curves": curves}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "muon_vs_adamw")
    parser.add_argument("--steps", type=int, nargs="+", default=[300], help="one, or one per model")
    parser.add_argument("--sweep-steps", type=int, nargs="+", default=[100], help="one, or one per model")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"conf/model options (default {MODELS})")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="data.global_batch_size")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "muon_vs_adamw.png")
    parser.add_argument("--jobs", type=int, default=2, help="model-optimizer chains at a time (default 2)")
    args = parser.parse_args()
    data = (f"data.seq_len={args.seq_len}", f"data.global_batch_size={args.batch}")
    steps, sweep_steps = (
        per_model(parser, args.models, "--steps", args.steps),
        per_model(parser, args.models, "--sweep-steps", args.sweep_steps),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    # every job runs on one thread (topology=local_cpu's threads_per_rank), so --jobs chains share the cores;
    # Muon's (the longest) start first
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = {(m, o): pool.submit(chain, args.out, m, o, sweep_steps[m], steps[m], args.seeds, data)
                for o in ("muon", "adamw") for m in args.models}  # fmt: skip
    results = {m: {o: runs[(m, o)].result() for o in SWEEP} for m in args.models}
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    load["wall_s"] = time.perf_counter() - start
    (args.out / "results.json").write_text(json.dumps({"load": load, "results": results}, indent=1))
    (args.out / "results.md").write_text(tables(results, load))
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    figure(results, args.figure)
    print((args.out / "results.md").read_text())
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
