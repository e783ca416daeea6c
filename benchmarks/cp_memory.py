"""Context parallel's memory: peak saved activations and peak RSS per rank against seq_len for cp = 1, 2, 4.

Runs ``train.py parallel=hybrid cp.size=C`` as a user would (llama_debug, one sample per step, dp = tp = pp = 1,
so the world is cp ranks) once per (seq_len, cp) and reads each run's summary.json: the peak of the bytes autograd
keeps saved for backward on each rank (``peak_saved_activation_bytes_per_rank``, parallel/foundation/activations.py),
the peak RSS of each rank, tokens/s per rank and the share of the step in cp's all-to-alls
(``cp_comm_fraction_median``). Beside them, the planner's prediction of one rank's saved activations (the cost
model's ``rank_activation_per_micro_batch``, parallel/plan/cost_model.py, at the same seq_len and cp).

    python benchmarks/cp_memory.py                              # seq_len 512 1024 2048, cp 1 2 4
    python benchmarks/cp_memory.py --seq-lens 1024 --cps 1 2 --steps 4 --out cp_memory.md

It ends with its target, marked met or missed: at the longest sequence, cp=2's activation peak per rank at most
0.55x cp=1's (issue 34). Timings measure the machine they run on: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
MODEL = "llama_debug"
TARGET = 0.55


def run_one(*, seq_len: int, cp: int, steps: int, extra: list[str], folder: Path) -> dict:
    run_dir = folder / f"s{seq_len}_cp{cp}"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "parallel=hybrid" if cp > 1 else "parallel=single",
        *([f"cp.size={cp}", "dp.size=1", "tp.size=1", "pp.size=1"] if cp > 1 else []),
        f"model={MODEL}",
        f"data.seq_len={seq_len}",
        "data.global_batch_size=1",
        f"trainer.max_steps={steps}",
        "trainer.log_every=1",
        "trainer.measure_every=1",  # every step's all-to-alls timed: the median over the run
        "trainer.checkpoint_every=0",
        "logger=none",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"failed": (proc.stderr or proc.stdout).strip().splitlines()[-1][:200]}
    return json.loads((run_dir / "summary.json").read_text())


def predicted_activation_bytes(*, seq_len: int, cp: int) -> float:
    """The cost model's saved activations of one rank for one micro-batch (one sample), fp32, no recomputation."""
    from hydra import compose, initialize_config_dir

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.cost_model import Candidate, estimate

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"model={MODEL}",
                f"data.seq_len={seq_len}",
                "data.global_batch_size=1",
                "planner.precision=fp32",
            ],
        )
    model, hardware, workload = specs_from_cfg(cfg)
    return estimate(
        Candidate(cp=cp), model=model, hardware=hardware, workload=workload
    ).rank_activation_per_micro_batch[0]


HEADER = (
    "| seq_len | cp | peak saved activations per rank (MiB) | x cp=1 | planned (MiB) | peak RSS per rank (MiB) | "
    "tokens/s per rank | all-to-all share |\n|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--cps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) and the JSON beside it")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides")
    args = parser.parse_args()
    rows, records = [HEADER], []
    ratio_at_longest = None
    with tempfile.TemporaryDirectory(prefix="cp_memory_") as tmp:
        for seq_len in args.seq_lens:
            base = None
            for cp in args.cps:
                s = run_one(seq_len=seq_len, cp=cp, steps=args.steps, extra=args.overrides, folder=Path(tmp))
                planned = predicted_activation_bytes(seq_len=seq_len, cp=cp)
                if "failed" in s:
                    rows.append(f"| {seq_len} | {cp} | failed: {s['failed']} | | | | | |")
                    continue
                acts = max(s["peak_saved_activation_bytes_per_rank"])
                base = acts if cp == 1 else base
                ratio = acts / base if base else None
                if cp == 2 and seq_len == max(args.seq_lens):
                    ratio_at_longest = ratio
                per_rank_tps = s["tokens_per_s"] / cp
                share = s.get("cp_comm_fraction_median")
                rows.append(
                    f"| {seq_len} | {cp} | {acts / MiB:.1f} | {ratio:.2f} | {planned / MiB:.1f} | "
                    f"{max(s['peak_memory_bytes_per_rank']) / MiB:.0f} | {per_rank_tps:,.0f} | "
                    f"{'–' if share is None else f'{share:.0%}'} |"
                    if ratio is not None
                    else f"| {seq_len} | {cp} | {acts / MiB:.1f} | – | {planned / MiB:.1f} | – | – | – |"
                )
                records.append(
                    {"seq_len": seq_len, "cp": cp, "peak_saved_activation_bytes": acts, "planned_bytes": planned,
                     "peak_rss_bytes": max(s["peak_memory_bytes_per_rank"]), "tokens_per_s_per_rank": per_rank_tps,
                     "cp_comm_fraction_median": share}
                )  # fmt: skip
    table = "\n".join(rows)
    if ratio_at_longest is None:
        verdict = "target not checked (needs cp 1 and 2 at the longest seq_len)"
    else:
        met = "met" if ratio_at_longest <= TARGET else "missed"
        verdict = f"target {met}: cp=2 holds {ratio_at_longest:.2f}x cp=1's activation peak per rank (<= {TARGET})"
    print(table)
    print(verdict)
    if args.out is not None:
        args.out.write_text(table + "\n\n" + verdict + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
