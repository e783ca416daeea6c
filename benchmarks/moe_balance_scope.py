"""The MoE balance's scope compared over a training run: ``model.balance_scope=global`` (the load-balancing loss's
expert counts over every data-parallel rank's micro-batch) against ``micro_batch`` (one forward's sequences), the
same model, data, seed and layout otherwise.

Each scope is one ``python train.py`` run (Qwen3-MoE debug under dp2 x ep2 by default: 2 gloo ranks, each forward
holding half the batch, so the two scopes differ). Prints, per scope, the LM loss averaged over the first and last
10% of the steps and the last step's, the auxiliary loss, and the run's expert load (max / mean tokens per expert
per layer, ``moe_imbalance`` in summary.json); draws both loss curves into one PNG beside the runs' own
expert-load heatmaps (``moe_expert_load.png`` in each run folder).

    python benchmarks/moe_balance_scope.py                      # 300 steps, into ./moe_balance_scope/
    python benchmarks/moe_balance_scope.py --steps 50 --out /tmp/scope
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPES = ("global", "micro_batch")
LAYOUT = ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1")


def run_scope(scope: str, *, common: list[str], out: Path) -> Path:
    run_dir = out / scope
    cmd = [sys.executable, str(ROOT / "train.py"), *common, f"model.balance_scope={scope}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return run_dir


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def row(scope: str, run_dir: Path) -> str:
    metrics = read_metrics(run_dir)
    tenth = max(1, len(metrics) // 10)
    first = sum(m["loss"] for m in metrics[:tenth]) / tenth
    last = sum(m["loss"] for m in metrics[-tenth:]) / tenth
    summary = json.loads((run_dir / "summary.json").read_text())
    worst = max(summary.get("moe_imbalance", {}).values(), default=float("nan"))
    aux = sum(m["moe_aux_loss"] for m in metrics[-tenth:]) / tenth
    return f"| {scope} | {first:.4f} | {last:.4f} | {metrics[-1]['loss']:.4f} | {aux:.4f} | {worst:.2f} |"


def draw(runs: dict[str, Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for scope, run_dir in runs.items():
        metrics = read_metrics(run_dir)
        ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], label=f"balance_scope={scope}", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("LM loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_moe_debug")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("moe_balance_scope"))
    args = parser.parse_args(argv)
    common = [
        f"model={args.model}",
        *LAYOUT,
        f"data.seq_len={args.seq_len}",
        f"data.global_batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every=1",
        "trainer.checkpoint_every=0",
        "logger=none",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {scope: run_scope(scope, common=common, out=args.out) for scope in SCOPES}
    print(
        "| balance_scope | loss, first 10% | loss, last 10% | last step | aux loss, last 10% | worst layer imbalance |"
    )
    print("|---|---|---|---|---|---|")
    for scope, run_dir in runs.items():
        print(row(scope, run_dir))
    draw(runs, args.out / "loss_by_scope.png")
    print(
        f"curves: {args.out / 'loss_by_scope.png'}; heatmaps: {', '.join(str(r / 'moe_expert_load.png') for r in runs.values())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
