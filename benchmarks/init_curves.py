"""``model.init=reference`` against ``model.init=normal``: the default job's data, each model, several seeds.

Each run is ``python train.py parallel=single model=M model.init=I trainer.seed=S`` (the default data: the byte
corpus, batch and optimizer of ``conf/config.yaml``), its loss read back from ``metrics.jsonl`` at every logged
step. Writes ``init_curves.json`` (every curve) and ``init_curves.png`` (mean over seeds, one panel per model, the
seeds' range shaded) under ``--out``, and prints a table of the last logged loss per model and init (mean, min,
max over seeds).

    python benchmarks/init_curves.py                                   # gpt_small and llama_debug, 300 steps, seeds 0 1 2
    python benchmarks/init_curves.py --models gpt_small --steps 100 --seeds 0 1 2
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
INITS = ("reference", "normal")


def run(model: str, init: str, seed: int, *, steps: int, log_every: int, extra: list[str]) -> list[tuple[int, float]]:
    with tempfile.TemporaryDirectory(prefix="init_curves_") as tmp:
        run_dir = Path(tmp) / "run"
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "parallel=single",
                f"model={model}",
                f"model.init={init}",
                f"trainer.seed={seed}",
                f"trainer.max_steps={steps}",
                f"trainer.log_every={log_every}",
                "trainer.checkpoint_every=0",
                f"hydra.run.dir={run_dir}",
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "WANDB_SILENT": "true"},
        )
        if out.returncode != 0:
            raise RuntimeError(f"train.py model={model} model.init={init} failed:\n{out.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r]


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(curves)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for init in INITS:
            runs = list(curves[model][init].values())
            steps = [s for s, _ in runs[0]]
            by_step = list(zip(*[[loss for _, loss in r] for r in runs]))
            ax.plot(steps, [statistics.mean(v) for v in by_step], label=f"model.init={init}")
            ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step], alpha=0.25)
        ax.set_title(f"{model} ({len(runs)} seeds)")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt_small", "llama_debug"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "init_curves")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra train.py overrides")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    load_before, started = os.getloadavg(), time.perf_counter()
    curves: dict = {m: {i: {} for i in INITS} for m in args.models}
    for model in args.models:
        for seed in args.seeds:
            for init in INITS:
                curves[model][init][seed] = run(
                    model, init, seed, steps=args.steps, log_every=args.log_every, extra=args.overrides
                )
                step, loss = curves[model][init][seed][-1]
                print(f"{model} init={init} seed={seed}: loss {loss:.4f} at step {step}", flush=True)
    (args.out / "init_curves.json").write_text(json.dumps(curves, indent=1))
    plot(curves, args.out / "init_curves.png")
    print(
        f"\n{time.perf_counter() - started:.0f} s; load average before {' '.join(f'{v:.2f}' for v in load_before)}, "
        f"after {' '.join(f'{v:.2f}' for v in os.getloadavg())}; wrote {args.out / 'init_curves.json'} and "
        f"{args.out / 'init_curves.png'}\n"
    )
    print(f"| model | init | first logged loss (mean) | loss at step {args.steps}: mean (min–max over seeds) |")
    print("|---|---|---:|---:|")
    for model in args.models:
        for init in INITS:
            runs = curves[model][init].values()
            first = statistics.mean(r[0][1] for r in runs)
            last = [r[-1][1] for r in runs]
            print(f"| {model} | {init} | {first:.4f} | {statistics.mean(last):.4f} ({min(last):.4f}–{max(last):.4f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
