"""The same Llama trained by the native family (``models/llama``) and by the Hugging Face backend
(``models/hf_transformers``: transformers' own ``LlamaForCausalLM`` modules), side by side.

One Llama folder is written by transformers (random weights, ``--hidden`` wide, ``--layers`` deep, nothing
downloaded); each round runs ``python train.py model.init_from=DIR`` once per backend (``model.backend=native`` and
``model.backend=transformers``, alternating which goes first) under each layout (``parallel=fsdp`` and
``parallel=tp`` by default, 2 ranks) and reads the run's own ``summary.json``: tokens/s, CPU seconds per step per rank
(``median_step_cpu_s_per_rank``, the busiest rank's) and the time to the first step. It prints the medians, their ranges, the
transformers / native ratios and the load average before and after: numbers from a loaded machine say nothing.

    python benchmarks/hf_backend.py                             # fsdp and tp, 3 rounds, 20 steps
    python benchmarks/hf_backend.py --rounds 5 --steps 50 --layouts fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("native", "transformers")
LAYOUTS = {"fsdp": ["parallel=fsdp"], "tp": ["parallel=tp"]}
KEYS = {
    "tokens_per_s": "tokens/s",
    "median_step_cpu_s_per_rank": "CPU s/step/rank",
    "time_to_first_step_s": "first step s",
}


def write_llama(folder: Path, *, hidden: int, layers: int, vocab: int = 256) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64),
        num_key_value_heads=max(2, hidden // 128),
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def one_run(folder: Path, backend: str, layout: list[str], *, steps: int, seq: int, run_dir: Path) -> dict[str, float]:
    job = [f"trainer.max_steps={steps}", "logger=none", f"data.seq_len={seq}", "data.global_batch_size=8"]
    cmd = [sys.executable, str(ROOT / "train.py"), f"model.init_from={folder}", f"model.backend={backend}", *layout]
    env = {**os.environ, "WANDB_SILENT": "true"}
    subprocess.run([*cmd, *job, f"hydra.run.dir={run_dir}"], check=True, capture_output=True, cwd=ROOT, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    per_rank = {k: summary[k] if isinstance(summary[k], list) else [summary[k]] for k in KEYS}
    return {k: max(float(v) for v in values) for k, values in per_rank.items()}  # the slowest rank's


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_hf_backend_") as tmp:
        folder = write_llama(Path(tmp) / "llama", hidden=args.hidden, layers=args.layers)
        for r in range(args.rounds):
            for layout in args.layouts:
                for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
                    run = Path(tmp) / f"{layout}_{backend}_{r}"
                    got.setdefault((layout, backend), []).append(
                        one_run(folder, backend, LAYOUTS[layout], steps=args.steps, seq=args.seq, run_dir=run)
                    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"Llama {args.hidden} wide, {args.layers} layers, seq {args.seq}, {args.steps} steps, {args.rounds} rounds")
    print("| layout | backend | " + " | ".join(KEYS.values()) + " |\n|---|---|" + "---|" * len(KEYS))
    for (layout, backend), rows in got.items():
        print(f"| {layout} | {backend} | " + " | ".join(spread([r[k] for r in rows]) for k in KEYS) + " |")
    for layout in args.layouts:
        med = {b: {k: statistics.median(r[k] for r in got[(layout, b)]) for k in KEYS} for b in BACKENDS}
        ratios = ", ".join(f"{name} {med['transformers'][k] / med['native'][k]:.3f}" for k, name in KEYS.items())
        print(f"{layout}: transformers / native: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
