"""Pipeline schedules x micro-batches on 2 local CPU ranks: time, throughput, bubble, activation memory.

Runs ``train.py parallel=pp`` once per (schedule, m) as a user would and reads each run's
summary.json; prints a Markdown table (and writes it with ``--out``). Every number is measured in
the run except ``bubble (theory)``, which replays the schedule's action order with unit costs
(F=1, B=2). Peak activation memory is what autograd keeps saved between a micro-batch's forward and
its backward on each stage, at its highest in the step: the memory the schedule decides.

    python benchmarks/pipeline.py                    # all schedules, m in 1 2 4 8 (about 4 minutes)
    python benchmarks/pipeline.py --schedules gpipe 1f1b --micro-batches 8 --steps 10
    python benchmarks/pipeline.py --uneven           # uniform vs balanced split of an uneven model

It ends with its targets, each marked met or missed: GPipe's measured bubble at m=1 within 0.45-0.65 (theory
0.5; communication only adds idle time) and falling as m grows; and, with ``--uneven`` (two wide blocks then two
narrow ones, m=8), the balanced split's imbalance part of the bubble at least 0.05 below the uniform split's.
These are speeds of one machine, so they live here and not in the tests.
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

from parallel.pipeline.schedules import SCHEDULES, schedule_spec  # noqa: E402

MiB = 1024 * 1024


def run_one(*, schedule: str, m: int, steps: int, extra: list[str], folder: Path) -> dict | None:
    spec = schedule_spec(schedule)
    v = 1 if spec.placement == "single" else 2
    problem = spec.micro_batch_problem(micro_batches=m, pp=2, stages=2 * v)
    if problem:
        return {"skipped": problem}
    run_dir = folder / f"{schedule}_m{m}"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "parallel=pp",
        f"pp.schedule={schedule}",
        f"pp.stages_per_rank={v}",
        f"pp.micro_batches={m}",
        f"trainer.max_steps={steps}",
        "pp.trace_step=0",
        "logger=none",
        f"trainer.log_every={steps}",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"skipped": (proc.stderr or proc.stdout).strip().splitlines()[-1][:200]}
    return json.loads((run_dir / "summary.json").read_text())


def row(schedule: str, m: int, s: dict) -> str:
    if "skipped" in s:
        return f"| {schedule} | {m} | – | – | – | – | – | – | skipped: {s['skipped']} |"
    p = s["pipeline"]
    acts = " / ".join(f"{(r['peak_activation_bytes'] or 0) / MiB:.1f}" for r in p["stages"])
    rss = " / ".join(f"{b / MiB:.0f}" for b in s["peak_memory_bytes_per_rank"])
    return (
        f"| {schedule} | {m} | {s['median_step_time_s'] * 1e3:.0f} | {s['tokens_per_s']:,.0f} | "
        f"{p['bubble_fraction']:.2f} | {p['bubble_theoretical']:.2f} | {p['imbalance_ratio']:.2f} | {acts} | "
        f"{rss} |"
    )


HEADER = (
    "| schedule | m | step (ms) | tokens/s | bubble (measured) | bubble (theory) | imbalance | "
    "peak activations per stage (MiB) | peak RSS per rank (MiB) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


#: two wide blocks then two narrow ones: the uniform split puts both wide blocks on stage 0
UNEVEN = (
    "model.n_layers=4",
    "model.layer_d_ff=[4096,4096,64,64]",
    "pp.schedule=gpipe",
    "pp.micro_batches=8",
    "data.seq_len=32",
    "data.global_batch_size=32",
    "trainer.max_steps=6",
    "pp.trace_step=0",
    "logger=none",
)


def run_split(policy: str, folder: Path) -> dict:
    run_dir = folder / f"split_{policy}"
    cmd = [sys.executable, str(ROOT / "train.py"), "parallel=pp", f"pp.split={policy}", *UNEVEN]
    subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads((run_dir / "summary.json").read_text())["pipeline"]


def target(name: str, met: bool, measured: str) -> str:
    return f"- {'met' if met else 'MISSED'}: {name} (measured {measured})"


def gpipe_targets(results: dict[tuple[str, int], dict]) -> list[str]:
    """GPipe's bubble: near (p-1)/p = 0.5 at m=1, and falling as m grows."""
    got = {
        m: s["pipeline"]["bubble_fraction"] for (name, m), s in results.items() if name == "gpipe" and "pipeline" in s
    }
    out = []
    if 1 in got:
        out.append(target("gpipe m=1 bubble within 0.45-0.65", 0.45 <= got[1] <= 0.65, f"{got[1]:.2f}"))
    if len(got) > 1:
        ms = sorted(got)
        falls = all(got[a] > got[b] for a, b in zip(ms, ms[1:]))
        out.append(target("gpipe bubble falls as m grows", falls, ", ".join(f"m={m}: {got[m]:.2f}" for m in ms)))
    return out


def uneven_targets(folder: Path) -> list[str]:
    uniform, balanced = run_split("uniform", folder), run_split("balanced", folder)
    gap = uniform["bubble_imbalance"] - balanced["bubble_imbalance"]
    return [
        f"- uneven model: uniform split {uniform['split_points']} imbalance {uniform['imbalance_ratio']:.2f}x, "
        f"balanced split {balanced['split_points']} imbalance {balanced['imbalance_ratio']:.2f}x",
        target("balanced split's imbalance bubble >= 0.05 below uniform's", gap >= 0.05, f"{gap:+.2f}"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    ap.add_argument("--micro-batches", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, help="also write the Markdown table here")
    ap.add_argument("--uneven", action="store_true", help="also compare the uniform and balanced splits")
    ap.add_argument(
        "overrides",
        nargs="*",
        default=["data.seq_len=128", "data.global_batch_size=16"],
        help="extra train.py overrides (default: data.seq_len=128 data.global_batch_size=16)",
    )
    args = ap.parse_args()
    lines = [HEADER]
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_pp_") as tmp:
        for schedule in args.schedules:
            for m in args.micro_batches:
                s = run_one(schedule=schedule, m=m, steps=args.steps, extra=args.overrides, folder=Path(tmp))
                results[(schedule, m)] = s
                lines.append(row(schedule, m, s))
                print(lines[-1], flush=True)
    m = max(args.micro_batches)
    memory = []
    for schedule in ("gpipe", "1f1b"):
        s = results.get((schedule, m))
        if s and "pipeline" in s:
            peak = [r["peak_activation_bytes"] / MiB for r in s["pipeline"]["stages"]]
            memory.append(
                f"- {schedule} at m={m}: peak activations "
                + " / ".join(f"{x:.1f}" for x in peak)
                + " MiB on stage 0 / 1"
            )
        targets = gpipe_targets(results) + (uneven_targets(Path(tmp)) if args.uneven else [])
    text = "\n".join(lines) + ("\n\n" + "\n".join(memory) if memory else "") + "\n"
    text += ("\nTargets:\n" + "\n".join(targets) + "\n") if targets else ""
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
