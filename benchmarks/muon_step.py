"""The optimizer step of ``optim=muon`` against AdamW's, over llama_debug's parameters as fsdp dp2 and tp2 hold them,
side by side in one run; and Muon's two ways of making sharded matrices whole (``optim.muon_gather``).

    python benchmarks/muon_step.py [ROUNDS] [--model llama_debug] [--out outputs/muon_step.md]   # under torchrun: 2 gloo ranks

Each rank builds the model from ``conf/model/<model>.yaml`` (meshtrain's own modules, names and TP plan), shards it
(FSDP2 over both ranks: every block and the root ``fully_shard``-ed; or the family's tensor-parallel plan), gives
every parameter a fixed gradient and times ``optimizer.step()``: AdamW as ``optim=adamw`` builds it (fused kernels),
Muon with ``muon_gather=spread`` and with ``everywhere`` (``conf/optim/muon.yaml``'s settings otherwise). Rank 0
prints the median of 20 steps after 3 warm-up steps per round, rounds alternating the order, and the ratios, and
writes the same table to ``--out``. The load average is printed with it: on a shared machine the ratios are a rough
indication only.
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
OPTIMIZERS = ("adamw", "muon spread", "muon everywhere")


def model_config(name: str):
    """The family's spec and the composed ``model=<name>`` node, as train.py composes it."""
    from hydra import compose, initialize_config_dir

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs
    from models.registry import spec_for

    register_resolvers()
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={name}", "data.seq_len=64"])
    return spec_for(cfg.model), cfg.model


def layouts(name: str, mesh) -> dict[str, list]:
    import torch
    from torch.distributed.fsdp import fully_shard

    spec, config = model_config(name)

    def build():
        torch.manual_seed(0)
        return spec.build(config)

    fsdp = build()
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    tp = spec.parallelize_fn()(build(), tp_mesh=mesh)
    sets = {"fsdp dp2": list(fsdp.named_parameters()), "tp2": list(tp.named_parameters())}
    for named in sets.values():
        for _, p in named:
            p.grad = torch.full_like(p, 1e-3)
    return sets


def build(kind: str, named: list):
    import torch

    from parallel.foundation.optimizer import build_optimizer_over
    from parallel.optim.muon import Muon

    if kind == "adamw":
        factory = functools.partial(torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
        return build_optimizer_over(factory, [p for _, p in named])
    return Muon(named, muon_gather=kind.split()[1])


def worker(rounds: int, model: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sets = layouts(model, init_device_mesh("cpu", (dist.get_world_size(),)))
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for kind in OPTIMIZERS if r % 2 == 0 else OPTIMIZERS[::-1]:
            for name, named in sets.items():
                opt = build(kind, named)
                for _ in range(3):
                    opt.step()
                for _ in range(20):
                    dist.barrier()
                    t0 = time.perf_counter()
                    opt.step()
                    times.setdefault((name, kind), []).append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        text = table(model, rounds, sets, times, ranks=dist.get_world_size())
        print(text)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    dist.destroy_process_group()


def table(model: str, rounds: int, sets: dict, times: dict, *, ranks: int) -> str:
    """The medians in ms per layout and optimizer, and the ratios, as markdown."""
    lines = [
        f"{model}: {rounds} rounds x 20 steps, rank 0 of {ranks}, load average {os.getloadavg()[0]:.2f} at the end",
        "",
        "| parameters | "
        + " | ".join(f"{k} ms" for k in OPTIMIZERS)
        + " | muon spread / adamw | everywhere / spread |",
        "|---|" + "---:|" * (len(OPTIMIZERS) + 2),
    ]
    for name in sets:
        ms = {k: statistics.median(times[(name, k)]) * 1e3 for k in OPTIMIZERS}
        cells = " | ".join(f"{ms[k]:.2f}" for k in OPTIMIZERS)
        ratios = f"{ms['muon spread'] / ms['adamw']:.2f} | {ms['muon everywhere'] / ms['muon spread']:.2f}"
        lines.append(f"| {name} | {cells} | {ratios} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rounds", nargs="?", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--model", default="llama_debug", help="a conf/model option (default llama_debug)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "muon_step.md", help="the table, as markdown")
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.rounds, args.model, args.out)
        return 0
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    cmd = [torchrun, "--nproc_per_node=2", __file__, str(args.rounds), "--model", args.model, "--out", str(args.out)]
    code = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
