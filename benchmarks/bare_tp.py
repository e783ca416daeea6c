"""A hand-written torch tensor-parallel loop: ``parallelize_module`` with Megatron's plan (attention's
wq/wk/wv and the feed-forward's w1 (and SwiGLU's w3) column-wise, wo and w2 row-wise, the head column-wise with its output
replicated; embeddings and norms replicated), as ``parallel=tp`` with its defaults (no sequence or loss
parallel), 2 ranks under torchrun. Every rank sees the whole batch. Shared parts: ``benchmarks/bare_common.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from benchmarks import bare_common as bare


def megatron_plan(n_layers: int, *, gated: bool = False, head_norms: bool = False) -> dict:
    """``gated``: SwiGLU's w3 column-wise beside w1 (Llama, Qwen3); ``head_norms``: Qwen3's per-head q/k norms
    over the local heads (``SequenceParallel`` on the head dimension, so their gradients sum over the ranks)."""
    plan: dict = {"output": ColwiseParallel(output_layouts=Replicate())}
    for i in range(n_layers):
        plan.update({f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
        plan[f"layers.{i}.attention.wo"] = RowwiseParallel()
        plan[f"layers.{i}.feed_forward.w1"] = ColwiseParallel()
        plan[f"layers.{i}.feed_forward.w2"] = RowwiseParallel()
        if gated:
            plan[f"layers.{i}.feed_forward.w3"] = ColwiseParallel()
        if head_norms:
            plan.update(
                {
                    f"layers.{i}.attention.{n}": SequenceParallel(sequence_dim=2, use_local_output=True)
                    for n in ("q_norm", "k_norm")
                }
            )
    return plan


def main() -> None:
    args = bare.parse_args()
    rank, world, device = bare.init(args)
    mesh = init_device_mesh(device.type, (world,))
    model = bare.build_model(args, device=device)
    model = parallelize_module(
        model,
        mesh,
        megatron_plan(
            len(model.layers),
            gated=hasattr(model.layers["0"].feed_forward, "w3"),
            head_norms=getattr(model.layers["0"].attention, "q_norm", None) is not None,
        ),
    )
    opt = bare.adamw(model.parameters(), args)
    params = list(model.parameters())
    sharded = [p for p in params if isinstance(p, DTensor) and p.placements[0].is_shard()]
    replicated = [p for p in params if not any(p is q for q in sharded)]

    def clip() -> torch.Tensor:
        """Global norm: the shards' squares summed over the tp group, the replicated parameters' counted once."""
        shard_sq = torch.nn.utils.get_total_norm([p.grad.to_local() for p in sharded], foreach=True).double() ** 2
        dist.all_reduce(shard_sq)
        local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in replicated]
        sq = shard_sq + torch.nn.utils.get_total_norm(local, foreach=True).double() ** 2
        return bare.clip_by_squared_norm_([p.grad for p in params], sq, args.clip)

    step = bare.module_train_step(
        model=model, opt=opt, data=bare.corpus(args), rows=slice(0, args.batch), clip=clip, device=device
    )
    bare.timed_loop(args, step, report=rank == 0)
    del model, opt, step
    bare.close()


if __name__ == "__main__":
    main()
