"""One optimizer step over gpt_small's parameters as each strategy holds them, under each ``optim.implementation``.

    python benchmarks/optimizer_step.py [ROUNDS]   # starts itself under torchrun, 2 gloo ranks, 1 thread each

Three parameter sets: plain tensors (single, DDP), FSDP2's shards (every block and the root ``fully_shard``-ed
over both ranks) and TP's mix (Megatron's plan: sharded projections beside plain norms and embeddings). Each
optimizer is meshtrain's own (``build_optimizer_over``: parameters grouped by kind) with AdamW at
``conf/optim/adamw.yaml``'s settings; the gradients are fixed; rank 0 prints the median of 30 steps after 5
warm-up steps, per set and implementation, in alternating rounds. torch's own default on CPU is ``for-loop``.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("for-loop", "foreach", "fused")


def parameter_sets(mesh) -> dict[str, list]:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from benchmarks import bare_common as bare
    from benchmarks.bare_tp import megatron_plan
    from models.gpt.model import GPT

    def gpt() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT(**bare.SHAPE, max_seq_len=128)

    fsdp = gpt()
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    tp = parallelize_module(gpt(), mesh, megatron_plan(bare.SHAPE["n_layers"]))
    sets = {"plain (single, ddp)": list(gpt().parameters()), "FSDP2 shards": list(fsdp.parameters())}
    sets["TP (shards + plain)"] = list(tp.parameters())
    for params in sets.values():
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
    return sets


def worker(rounds: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from parallel.foundation.optimizer import build_optimizer_over

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sets = parameter_sets(init_device_mesh("cpu", (dist.get_world_size(),)))
    factory = functools.partial(torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for impl in IMPLEMENTATIONS if r % 2 == 0 else IMPLEMENTATIONS[::-1]:
            for name, params in sets.items():
                opt = build_optimizer_over(factory, params, implementation=impl)
                for _ in range(5):
                    opt.step()
                for _ in range(30):
                    t0 = time.perf_counter()
                    opt.step()
                    times.setdefault((name, impl), []).append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(f"\n{rounds} rounds x 30 steps, rank 0 of {dist.get_world_size()}, load {os.getloadavg()[0]:.2f}")
        print("\n| parameters | " + " | ".join(f"`{i}` ms" for i in IMPLEMENTATIONS) + " | fused / for-loop |")
        print("|---|" + "---:|" * (len(IMPLEMENTATIONS) + 1))
        for name in sets:
            ms = {i: statistics.median(times[(name, i)]) * 1e3 for i in IMPLEMENTATIONS}
            cells = " | ".join(f"{ms[i]:.2f}" for i in IMPLEMENTATIONS)
            print(f"| {name} | {cells} | {ms['fused'] / ms['for-loop']:.2f} |")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rounds", nargs="?", type=int, default=3, help="alternating rounds (default 3)")
    rounds = parser.parse_args().rounds
    if "RANK" in os.environ:
        worker(rounds)
        return 0
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return subprocess.run([torchrun, "--nproc_per_node=2", __file__, str(rounds)], env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())
