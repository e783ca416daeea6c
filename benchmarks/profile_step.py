"""torch.profiler's op table for one training step of a decoder (forward, loss, backward, clipping, AdamW).

The model is built from its ``conf/model/<name>.yaml`` shape as ``benchmarks/bare_common.py`` builds it, fed
byte-corpus batches; a few warm-up steps run first, then one profiled step. Prints the ops sorted by self CPU
time (the table docs/performance.md quotes) and the load average.

    python benchmarks/profile_step.py --model llama_debug --batch 16 --seq 256
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bare_common import MODELS, VOCAB  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=list(MODELS), default="llama_debug")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cls, shape = MODELS[args.model]
    torch.manual_seed(0)
    model = cls(**shape, max_seq_len=args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    x = torch.randint(0, VOCAB, (args.batch, args.seq))
    y = torch.roll(x, -1, dims=1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).reshape(-1, VOCAB).float(), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    for _ in range(3):
        step()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    print(
        f"{args.model}, batch {args.batch} x seq {args.seq}, {args.threads} thread(s), torch {torch.__version__}; "
        f"load average {load}"
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
