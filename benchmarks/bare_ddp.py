"""A hand-written torch DDP loop: the baseline train.py is measured against (run under torchrun).

Same model class, data, batch, optimizer and thread count as ``python train.py`` with its defaults;
none of meshtrain's launcher, measurement or sinks. Prints one JSON line from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from models.gpt.model import GPT
from trainer.data.datasets import TextCorpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--launch-time", type=float, default=time.time())
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(GPT(vocab_size=256, n_layers=4, d_model=128, n_heads=4, d_ff=512, max_seq_len=args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    data = TextCorpus(
        global_batch_size=args.batch, seq_len=args.seq, cache_dir=os.path.expanduser("~/.cache/meshtrain")
    )
    data.prepare()
    n = args.batch // world
    times, first_step_end = [], None
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = data.global_batch(step)
        x, y = x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        times.append(time.perf_counter() - t0)
        if first_step_end is None:
            first_step_end = time.time()
        if step % 10 == 0 and rank == 0:
            loss.item()
    if rank == 0:
        steady = times[2:]
        print(
            json.dumps(
                {
                    "tokens_per_s": args.batch * args.seq / statistics.median(steady),
                    "median_step_time_s": statistics.median(steady),
                    "launch_to_first_step_s": first_step_end - args.launch_time,
                }
            )
        )
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
