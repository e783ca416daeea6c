"""A hand-written torch expert-parallel loop, dp=2 x ep=2 on 2 ranks (torchrun), as ``parallel=hybrid dp.size=2
ep.size=2 tp.size=1 pp.size=1`` lays it out: every MoE block keeps the experts of its ep rank (``E / ep`` whole
experts, plain parameters), routes its own tokens with the model's router, sends each (token, choice) row to the
rank owning its expert by ``all_to_all_single`` (uneven splits, the counts exchanged first), runs the local experts
there and sends the outputs back the same way (torch's autograd all-to-all, whose backward is the reverse
exchange). FSDP2 shards the experts over their own mesh (the dp / ep ranks holding the same experts: one rank
here), then each block and the root over dp. An expert's gradient sums the contributions of every ep rank's tokens,
so it is divided by ep after backward (the mean over the data-parallel ranks, as the dense parameters'); the norm
for clipping sums every rank's local squares (shards and experts are disjoint). As meshtrain's default
(``model.balance_scope=global``) each block's load-balancing loss counts its experts over every rank's batch (an
all-reduce of E counts over dp), and after each step the routing biases move from the step's counts summed over the
ranks (DeepSeek-V3's balancing; a no-op for Qwen3-MoE without it). ``--model qwen3_moe_debug`` or
``deepseek_v3_debug``.
Shared parts: ``benchmarks/bare_common.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from benchmarks import bare_common as bare
from models.moe import LocalDispatch, Routed, moe_layers, update_expert_bias

#: the MoE models of ``bare_common.MODELS``
MOE_MODELS = ("qwen3_moe_debug", "deepseek_v3_debug")


@dataclass
class Exchanged(Routed):
    """The rows this rank's experts run (grouped by local expert) and how to send their outputs back."""

    sent: list[int] | None = None
    """Rows sent to each ep rank."""
    received: list[int] | None = None
    """Rows received from each ep rank."""
    order: torch.Tensor | None = None
    """The received row (source-major) of each row in local-expert order."""


class AllToAllDispatch(LocalDispatch):
    """The model's local sort by expert, then the rows exchanged so each rank runs its own experts over every ep
    rank's rows for them."""

    def __init__(self, n_experts: int, *, group: dist.ProcessGroup, ep: int):
        super().__init__(n_experts)
        self.group, self.ep, self.local = group, ep, n_experts // ep

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Exchanged:
        routed = super().dispatch(x, idx, weights)  # rows sorted by expert: owner by owner
        counts = torch.empty_like(routed.counts)
        dist.all_to_all_single(counts, routed.counts, group=self.group)  # rows per (source rank, local expert)
        counts = counts.view(self.ep, self.local)
        sent = routed.counts.view(self.ep, self.local).sum(1).tolist()
        received = counts.sum(1).tolist()
        rows = all_to_all_single_autograd(routed.rows, received, sent, self.group)
        expert = torch.arange(self.local, device=x.device).repeat(self.ep).repeat_interleave(counts.reshape(-1))
        order = expert.argsort(stable=True)
        return Exchanged(
            rows=rows[order],
            counts=counts.sum(0),
            token=routed.token,
            weight=routed.weight,
            dropped=routed.dropped,
            sent=sent,
            received=received,
            order=order,
        )

    def combine(self, y: torch.Tensor, routed: Exchanged, tokens: int) -> torch.Tensor:
        back = torch.empty_like(y).index_copy(0, routed.order, y)  # source-major again
        return super().combine(
            all_to_all_single_autograd(back, routed.sent, routed.received, self.group), routed, tokens
        )


def balanced(step: Callable[[int], torch.Tensor], model: torch.nn.Module) -> Callable[[int], torch.Tensor]:
    """``step``, then DeepSeek-V3's routing biases moved from the step's counts summed over every rank."""

    def run(i: int) -> torch.Tensor:
        loss = step(i)
        update_expert_bias(model, reduce=lambda counts: dist.all_reduce(counts))
        return loss

    return run


def main() -> None:
    args = bare.parse_args(ep=2)
    if args.model not in MOE_MODELS:
        raise SystemExit(
            f"bare_ep.py --model {args.model}: expert parallel needs a MoE model ({', '.join(MOE_MODELS)})"
        )
    rank, world, device = bare.init(args)
    dp_mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    # ep inner (neighbouring ranks exchange tokens); the outer dimension holds the same experts: their FSDP2 mesh
    ep_mesh = init_device_mesh(device.type, (world // args.ep, args.ep), mesh_dim_names=("ep_fsdp", "ep"))
    ep_rank = ep_mesh["ep"].get_local_rank()
    model = bare.build_model(args, device=device)
    experts = []
    for block in moe_layers(model):
        block.dispatcher = AllToAllDispatch(block.n_experts, group=ep_mesh["ep"].get_group(), ep=args.ep)
        block.balance_group = dp_mesh.get_group()  # the load-balancing loss's counts over every rank's batch
        local = block.n_experts // args.ep
        for name, param in list(block.experts.named_parameters(recurse=False)):
            mine = param.detach()[ep_rank * local : (ep_rank + 1) * local].clone()
            setattr(block.experts, name, torch.nn.Parameter(mine))
        fully_shard(block.experts, mesh=ep_mesh["ep_fsdp"])
        experts += list(block.experts.parameters())
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    params = list(model.parameters())

    def clip() -> torch.Tensor:
        """Experts' gradients to the mean over the data-parallel ranks, then the global norm and torch's clip."""
        torch._foreach_mul_([p.grad.to_local() for p in experts], 1.0 / args.ep)
        grads = [p.grad for p in params]
        sq = torch.nn.utils.get_total_norm([g.to_local() for g in grads], foreach=True).double() ** 2
        dist.all_reduce(sq)
        return bare.clip_by_squared_norm_(grads, sq, args.clip)

    opt = bare.adamw(params, args)
    step = bare.module_train_step(
        model=model,
        opt=opt,
        data=bare.corpus(args),
        rows=bare.replica_rows(replica=rank, replicas=world, batch=args.batch),
        clip=clip,
        device=device,
    )

    bare.timed_loop(args, balanced(step, model), report=rank == 0)
    del model, opt, step, clip
    bare.close()


if __name__ == "__main__":
    main()
