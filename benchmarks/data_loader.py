"""Is the loader ever the bottleneck? Loader throughput vs what training consumes, and time waiting for data.

1. Loader alone: ``global_batch(step)`` of the byte-level default (``data=text``) and of a prepared BPE
   dataset (``data=tokens``, prepared here from the Python standard library's sources, no download),
   at the default job's batch (16 x 128), one thread, as a rank builds it.
2. The default job (``python train.py``: DDP on 2 CPU processes), short: its median tokens/s, the share
   of its step time spent waiting for data (``summary.json``'s ``data_wait_fraction``, from each step's
   ``data_time_s``), with the prefetch thread (default) and without it (``trainer.prefetch=0``).

Headroom = loader tokens/s / training tokens/s (the issue asks for >= 10x on CPU; < 2% waiting).

    python benchmarks/data_loader.py [--steps 60] [--batches 300] [--doc docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def loader_rate(data, batches: int) -> dict:
    data.global_batch(1)  # open the files
    t0 = time.perf_counter()
    for step in range(2, batches + 2):
        x, _ = data.global_batch(step)
    dt = time.perf_counter() - t0
    return {"batches_per_s": batches / dt, "tokens_per_s": batches * x.numel() / dt}


def stdlib_dataset(folder: Path, *, max_files: int, vocab: int) -> Path:
    from trainer.data.prepare import prepare

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))[:max_files]
    out = folder / "stdlib_bpe"
    prepare(inputs=[str(f) for f in files], output=str(out), vocab_size=vocab, progress=False, log=lambda *a: None)
    return out


def default_job(steps: int, *extra: str) -> dict:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            f"trainer.max_steps={steps}",
            f"trainer.log_every={steps}",
            "trainer.checkpoint_every=0",
            "logger=none",
            f"hydra.run.dir={run_dir}",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    s = json.loads((run_dir / "summary.json").read_text())
    return {k: s[k] for k in ("tokens_per_s", "median_step_time_s", "data_wait_fraction", "data_time_s_total")}


def markdown(result: dict) -> str:
    a, rates, job, job_inline = result["args"], result["loader"], result["default_job"], result["default_job_prefetch0"]
    lines = [
        "",
        "## Data loader",
        "",
        f"`python benchmarks/data_loader.py --steps {a['steps']} --batches {a['batches']}` (batch 16 x 128 tokens, "
        f"one thread; load average {result['load_average_1m']:.1f} on the shared machine).",
        "",
        "| loader | batches/s | tokens/s | headroom over training |",
        "|---|---|---|---|",
    ]
    for k, v in rates.items():
        lines.append(f"| {k} | {v['batches_per_s']:,.0f} | {v['tokens_per_s']:,.0f} | {result['headroom'][k]:,.0f}x |")
    lines += [
        "",
        "| default job (`python train.py`, DDP x 2) | tokens/s | median step (ms) | waiting for data |",
        "|---|---|---|---|",
        f"| prefetch thread (default) | {job['tokens_per_s']:,.0f} | {job['median_step_time_s'] * 1e3:.0f} "
        f"| {job['data_wait_fraction']:.2%} |",
        f"| `trainer.prefetch=0` | {job_inline['tokens_per_s']:,.0f} | {job_inline['median_step_time_s'] * 1e3:.0f} "
        f"| {job_inline['data_wait_fraction']:.2%} |",
        "",
        "Headroom: the loader's tokens/s over the faster of the two training runs. Waiting for data: "
        "`data_wait_fraction` in summary.json, the sum of every step's `data_time_s` over the sum of step times.",
        f"The BPE dataset ({result['prepared_tokens']:,} tokens, vocabulary {a['vocab']}, from "
        f"{a['max_files']} stdlib files) took {result['prepare_s']:.1f} s to prepare.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="steps of the default job (each run)")
    p.add_argument("--batches", type=int, default=300, help="global batches the loader builds alone")
    p.add_argument("--max-files", type=int, default=120, help="stdlib files the BPE dataset is prepared from")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--doc", type=Path, help="append the results as a markdown section to this file")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from trainer.data.datasets import TextCorpus, TokenShards

    cache = os.environ.get("MESHTRAIN_CACHE", str(Path.home() / ".cache" / "meshtrain"))
    text = TextCorpus(global_batch_size=16, seq_len=128, cache_dir=cache)
    text.prepare()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = stdlib_dataset(Path(tmp), max_files=args.max_files, vocab=args.vocab)
        prep_s = time.perf_counter() - t0
        tokens = TokenShards(path=str(folder), global_batch_size=16, seq_len=128)
        tokens.prepare()
        meta = tokens.metadata
        rates = {"text (bytes)": loader_rate(text, args.batches), "tokens (BPE)": loader_rate(tokens, args.batches)}
    job = default_job(args.steps)
    job_inline = default_job(args.steps, "trainer.prefetch=0")
    # the faster of the two training runs: the headroom is never flattered by a slow (loaded) run
    consumed = max(job["tokens_per_s"], job_inline["tokens_per_s"])
    result = {
        "args": vars(args) | {"doc": str(args.doc) if args.doc else None},
        "loader": rates,
        "prepare_s": prep_s,
        "prepared_tokens": meta["splits"]["train"]["tokens"] + meta["splits"]["validation"]["tokens"],
        "default_job": job,
        "default_job_prefetch0": job_inline,
        "headroom": {k: v["tokens_per_s"] / consumed for k, v in rates.items()},
        "load_average_1m": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=2))
    if args.doc:
        with open(args.doc, "a") as f:
            f.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
