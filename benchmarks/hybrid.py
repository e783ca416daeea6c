"""Every 4-worker factorisation of dp × tp × pp on the same model and global batch: tokens/s and
peak memory per rank, measured by running ``train.py`` as a user would.

    python benchmarks/hybrid.py                      # table on stdout
    python benchmarks/hybrid.py --write-docs         # also replaces "## Hybrid" in docs/benchmarks.md
    python benchmarks/hybrid.py --steps 20 -- model.n_layers=8   # more steps, extra overrides
    python benchmarks/hybrid.py --repeats 3         # each layout 3 times, interleaved: median and range

Throughput is the run's median over steps (step 1, with its shape inference, is included in the
count but not in the median's influence); memory is each rank's peak resident set size on CPU (peak
allocated on CUDA), as ``summary.json`` reports it. A one-worker ``parallel=single`` run of the same job
is the reference the final losses are compared with. Everything the written section says is computed
from these runs (``section``): the job from the runs' own ``.hydra`` config, the loss agreement, the
spread between repeats, the load average, and the memory of a process that only imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"

#: name → overrides; the same 4 workers, model, data and global batch for each
LAYOUTS: dict[str, tuple[str, ...]] = {
    "dp4": ("parallel=ddp", "dp.size=4"),
    "pp4": ("parallel=pp", "pp.size=4"),
    "tp4": ("parallel=tp", "tp.size=4"),
    "dp2×pp2": ("parallel=hybrid", "dp.size=2", "tp.size=1", "pp.size=2"),
    "dp2×tp2": ("parallel=hybrid", "dp.size=2", "tp.size=2", "pp.size=1"),
    "tp2×pp2": ("parallel=hybrid", "dp.size=1", "tp.size=2", "pp.size=2"),
}
COMMON = (
    "logger=none",
    "trainer.log_every=1",
    "pp.micro_batches=4",
    "pp.schedule=1f1b",
    "pp.trace_step=0",
    "data.global_batch_size=16",
    "data.seq_len=64",
    "tp.measure_comm=false",
)


#: the one-process run every layout's final loss is compared with
REFERENCE = ("single", ("parallel=single",))


def run_layout(name: str, overrides: tuple[str, ...], *, steps: int, extra: list[str], out: Path) -> dict:
    run_dir = out / name.replace("×", "x")
    n = 1
    while run_dir.exists():  # repeats of a layout get their own folders
        n += 1
        run_dir = out / f"{name.replace('×', 'x')}-{n}"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        *COMMON,
        f"trainer.max_steps={steps}",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"layout": name, "error": (proc.stdout + proc.stderr).strip().splitlines()[-1][:200], "wall_s": wall}
    s = json.loads((run_dir / "summary.json").read_text())
    peaks = s["peak_memory_bytes_per_rank"]
    return {
        "layout": name,
        "tokens_per_s": s["tokens_per_s"],
        "step_ms": s["median_step_time_s"] * 1e3,
        "peak_mib_per_rank": [p / 2**20 for p in peaks],
        "bubble": s.get("bubble_fraction"),
        "final_loss": s["final_loss"],
        "wall_s": wall,
        "run_dir": str(run_dir),
    }


def job_of(run_dir: Path) -> dict:
    """What a run trained, read from the config Hydra saved in its folder."""
    import yaml

    cfg = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    choices = {}
    hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
    if hydra_yaml.exists():
        choices = yaml.safe_load(hydra_yaml.read_text())["hydra"]["runtime"]["choices"]
    model, data, pp, topo = cfg["model"], cfg["data"], cfg.get("pp", {}), cfg["topology"]
    return {
        "model": choices.get("model", "?"),
        "n_layers": model.get("n_layers"),
        "d_model": model.get("d_model"),
        "global_batch_size": data["global_batch_size"],
        "seq_len": data.get("seq_len"),
        "optim": choices.get("optim", "?"),
        "micro_batches": pp.get("micro_batches"),
        "schedule": pp.get("schedule"),
        "threads_per_rank": topo.get("threads_per_rank"),
        "device": topo.get("device", "cpu"),
    }


def merge_repeats(runs: list[dict]) -> dict:
    """One row per layout from its repeats: medians, and the tokens/s of every repeat."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    row = dict(ok[len(ok) // 2])
    row["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in ok)
    row["step_ms"] = statistics.median(r["step_ms"] for r in ok)
    row["repeats_tokens_per_s"] = [r["tokens_per_s"] for r in ok]
    row["failed_repeats"] = len(runs) - len(ok)
    return row


def agreed_decimals(values: list[float], most: int = 6) -> int | None:
    """The most decimals (up to ``most``) at which all values print the same; None if not even at 0."""
    agreed = None
    for d in range(most + 1):
        if len({f"{v:.{d}f}" for v in values}) != 1:
            break
        agreed = d
    return agreed


def loss_sentence(rows: list[dict], reference: dict | None) -> str:
    done = [r for r in rows if "error" not in r]
    failed = [r["layout"] for r in rows if "error" in r]
    parts = []
    if len(done) >= 2:
        losses = [r["final_loss"] for r in done]
        spread = max(losses) - min(losses)
        d = agreed_decimals(losses)
        if not d:  # not even one decimal in common
            parts.append(f"Final losses of the {len(done)} completed layouts differ by up to {spread:.4f}.")
        else:
            at_least = "at least " if d == 6 else ""
            parts.append(
                f"Final losses of the {len(done)} completed layouts agree to {at_least}{d} decimals "
                f"(largest difference {spread:.1e})."
            )
    elif done:
        parts.append(f"Only {done[0]['layout']} completed: no comparison between layouts.")
    if done and reference is not None and "error" not in reference:
        ref = reference["final_loss"]
        rel = max(abs(r["final_loss"] - ref) for r in done) / abs(ref)
        parts.append(
            f"parallel=single (one worker, same job) ended at {ref:.4f}; the largest relative difference "
            f"from it is {rel:.1e}."
        )
    elif reference is not None:
        parts.append(f"The parallel=single reference failed: {reference['error']}")
    if failed:
        parts.append(f"{len(failed)} layout(s) failed: {', '.join(failed)} (the table shows the error).")
    return " ".join(parts)


def spread_sentence(rows: list[dict], *, repeats: int, load: tuple[float, float] | None) -> str:
    parts = []
    if repeats > 1:
        spreads = [
            (max(r["repeats_tokens_per_s"]) / min(r["repeats_tokens_per_s"]), r)
            for r in rows
            if len(r.get("repeats_tokens_per_s", [])) > 1 and min(r["repeats_tokens_per_s"]) > 0
        ]
        if spreads:
            ratio, r = max(spreads, key=lambda x: x[0])
            runs = ", ".join(f"{t:,.0f}" for t in r["repeats_tokens_per_s"])
            parts.append(
                f"Across {repeats} interleaved repeats the tokens/s of one layout varied by up to {ratio:.2f}× "
                f"({r['layout']}: {runs}); the table shows medians."
            )
    else:
        parts.append("One run per layout (`--repeats N` measures the spread between runs).")
    if load is not None:
        parts.append(f"Load average (1 min) {load[0]:.1f} before the runs and {load[1]:.1f} after.")
    return " ".join(parts)


def table(rows: list[dict]) -> str:
    """The measured rows as a markdown table (final loss printed to 4 decimals)."""
    lines = [
        "| layout | tokens/s | ms/step | peak MiB per rank (rank 0..3) | bubble | final loss |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layout']} | failed: {r['error']} | | | | |")
            continue
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_mib_per_rank"])
        bubble = f"{r['bubble']:.0%}" if r["bubble"] is not None else "–"
        lines.append(
            f"| {r['layout']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.0f} | {peaks} | {bubble} | "
            f"{r['final_loss']:.4f} |"
        )
    return "\n".join(lines)


def write_docs(section: str, *, doc: Path = DOC) -> None:
    """Replace the "## Hybrid" section of ``doc`` (or append it), leaving the other sections as they are."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    head, sep, rest = text.partition("\n## Hybrid\n")
    tail = ""
    if sep:
        nxt = rest.find("\n## ")
        tail = rest[nxt:] if nxt >= 0 else ""
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(head.rstrip("\n") + "\n\n## Hybrid\n" + section.rstrip("\n") + "\n" + tail)


def section(
    rows: list[dict],
    *,
    reference: dict | None,
    job: dict,
    steps: int,
    repeats: int,
    machine: dict,
) -> str:
    """The "## Hybrid" section of docs/benchmarks.md: every number in it comes from the arguments."""
    workers = 4
    pipelined = f", {job['micro_batches']} micro-batches with {job['schedule']} where pipelined"
    cores = machine.get("cores")
    threads = job.get("threads_per_rank") or 1
    memory = "peak RSS" if job.get("device", "cpu") == "cpu" else "peak allocated memory"
    text = (
        f"\nEvery {workers}-worker factorisation of the same job (`benchmarks/hybrid.py`): {job['model']} "
        f"({job['n_layers']} blocks, d_model {job['d_model']}), global batch {job['global_batch_size']} × "
        f"{job['seq_len']} tokens, {job['optim']}{pipelined}, {steps} steps, median step"
        f"{f', median of {repeats} repeats' if repeats > 1 else ''}. Machine: {machine['arch']}, "
        f"torch {machine['torch']}, {machine['backend']}, {workers} workers on {cores} CPU cores "
        f"({threads} thread{'s' if threads != 1 else ''} each). Memory is each rank's {memory}"
    )
    if machine.get("torch_import_rss_mib") is not None:
        text += f" (a process that only imports torch peaks at {machine['torch_import_rss_mib']:.0f} MiB)"
    text += ".\n\n" + table(rows) + "\n\n"
    notes = []
    if cores is not None and workers * threads > cores:
        notes.append(
            f"Read with care: {workers * threads} threads time-share {cores} cores, so the numbers rank the "
            "layouts' overheads (collective count, pipeline bubble, per-op dispatch), not their scaling."
        )
    notes.append(spread_sentence(rows, repeats=repeats, load=machine.get("load")))
    notes.append(loss_sentence(rows, reference))
    return text + " ".join(n for n in notes if n) + "\n"


def torch_import_rss_mib() -> float | None:
    """Peak RSS of a fresh process that imports torch and nothing else (the floor under every rank)."""
    code = "import resource, torch; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    kib = int(proc.stdout.split()[-1])  # Linux: KiB (macOS reports bytes)
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1, help="runs per layout, interleaved (median reported)")
    parser.add_argument("--only", nargs="*", help="layout names to run (default: all)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--doc", type=Path, default=DOC, help="the markdown file --write-docs updates")
    parser.add_argument("extra", nargs="*", help="extra train.py overrides (after --)")
    args = parser.parse_args()
    layouts = {n: o for n, o in LAYOUTS.items() if not args.only or n in args.only}
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    runs: dict[str, list[dict]] = {name: [] for name in layouts}
    with tempfile.TemporaryDirectory(prefix="meshtrain-bench-") as tmp:
        out = Path(tmp)
        reference = run_layout(*REFERENCE, steps=args.steps, extra=args.extra, out=out)
        print(f"single: {reference.get('tokens_per_s', 0):,.0f} tok/s ({reference['wall_s']:.0f} s)", file=sys.stderr)
        for _ in range(args.repeats):  # interleaved, so machine noise hits every layout
            for name, overrides in layouts.items():
                row = run_layout(name, overrides, steps=args.steps, extra=args.extra, out=out)
                print(f"{name}: {row.get('tokens_per_s', 0):,.0f} tok/s ({row['wall_s']:.0f} s)", file=sys.stderr)
                runs[name].append(row)
        rows = [merge_repeats(r) for r in runs.values()]
        done = [r for r in [reference, *rows] if "error" not in r]
        job = job_of(Path(done[-1]["run_dir"])) if done else None
    md = table(rows)
    print(md)
    print(loss_sentence(rows, reference))
    if args.write_docs:
        if job is None:
            raise SystemExit("every run failed: nothing written")
        import torch

        machine = {
            "arch": platform.machine(),
            "torch": torch.__version__,
            "backend": "nccl" if torch.cuda.is_available() else "gloo",
            "cores": os.cpu_count(),
            "load": (load_before, os.getloadavg()[0]) if load_before is not None else None,
            "torch_import_rss_mib": torch_import_rss_mib(),
        }
        text = section(rows, reference=reference, job=job, steps=args.steps, repeats=args.repeats, machine=machine)
        write_docs(text, doc=args.doc)


if __name__ == "__main__":
    main()
