"""What ``optim=muon`` (parallel/optim/muon.py) costs a rank, as the cost model counts it.

- **Memory.** A block's weight matrix (attention, MLP, experts; not norms, biases or routers) keeps one fp32 momentum
  buffer instead of AdamW's two moments (``Workload.muon_bytes_per_param``); ``rank_muon_params`` is how many of a
  tensor-parallel rank's parameters are such matrices, the experts apart (``rank_expert_params``: all matrices).
- **Orthogonalisation.** torch's Newton-Schulz (``torch.optim._muon``, bf16) on an m x n matrix (m <= n) runs
  ``ns_steps`` iterations of X X^T (2m²n), b·A + c·A·A (2m³) and (that)·X (2m²n). A sharded matrix (FSDP2, tensor
  parallel) is orthogonalised by one owner rank of its mesh under ``spread``, by every rank under ``everywhere``; a
  matrix a rank holds whole (DDP, a pipeline stage alone, experts sharded by expert) by the rank that holds it.
- **Gathers.** ``spread``: each rank sends its part of every matrix (parameter, gradient, momentum) to the matrix's
  owner and gets the new parameter and momentum parts back: two all-to-all-like exchanges of its local shard over the
  matrix's mesh. ``everywhere``: every rank all-gathers the three tensors of every matrix. Both on the link the
  matrix's mesh (dp x cp x tp) spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parallel.foundation.dims import data_names, mesh_names
from parallel.plan.specs import Link

if TYPE_CHECKING:
    from parallel.plan.specs import HardwareSpec, ModelShape, Workload


def layer_shared_params(model: ModelShape, i: int) -> int:
    """A sparse layer's shared experts (0 when dense): matrices meshtrain runs whole on every tp rank."""
    return model.layer_moe_params(i) - model.layer_expert_params(i) - model.layer_router_params(i)


def layer_split_matrix_params(model: ModelShape, i: int) -> int:
    """The block's matrices tensor parallel splits: attention and a dense layer's MLP."""
    return model.layer_matmul_params(i) - model.layer_moe_params(i)


def rank_muon_params(model: ModelShape, layers: list[int], *, tp: int, meshtrain: bool) -> float:
    """Parameters of one tensor-parallel rank of a pipeline rank that Muon updates, the routed experts apart."""
    groups = model.layer_groups(layers)
    split = sum(n * layer_split_matrix_params(model, i) for i, n in groups)
    shared = sum(n * layer_shared_params(model, i) for i, n in groups)
    return split / tp + (shared if meshtrain else shared / tp)


def ns_flops(rows: int, cols: int, *, steps: int) -> float:
    """FLOPs of torch's Newton-Schulz on a rows x cols matrix (the smaller side squared: torch transposes a tall one)."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m**3)


def layer_ns_flops(model: ModelShape, i: int, *, steps: int) -> tuple[float, float]:
    """(the block's non-expert matrices, its routed experts): Newton-Schulz FLOPs of one step."""
    dense = sum(ns_flops(n_out, n_in, steps=steps) for _, n_in, n_out in model.layer_linears(i))
    experts = 3 * model.n_experts * ns_flops(model.moe_d_ff, model.d_model, steps=steps) if model.sparse[i] else 0.0
    return dense, experts


@dataclass(frozen=True)
class MuonCost:
    ns_flops: float = 0.0
    """Newton-Schulz FLOPs this rank runs per step."""
    ns_s: float = 0.0
    gather_bytes: float = 0.0
    """Bytes this rank sends per step to make its sharded matrices whole and to give them back."""
    gather_s: float = 0.0
    """Their time (``parallel/plan/cost_model.py`` ``muon_gather_s``)."""
    mesh: int = 1
    """Ranks a dense matrix is sharded over (dp x cp under FSDP2, times tp)."""
    link: Link | None = None
    spread: bool = True
    out_bytes: float = 0.0
    """spread: a rank's parts of the parameters, gradients and momenta it sends to their owners; everywhere: the
    three whole tensors of every matrix each rank gathers."""
    back_bytes: float = 0.0
    """spread: the new parameter and momentum parts it gets back (everywhere: none)."""


def muon_step_cost(
    model: ModelShape, layers: list[int], *, c: Any, hardware: HardwareSpec, workload: Workload
) -> MuonCost:
    """Per step on a rank holding ``layers`` in the layout ``c`` (a cost_model ``Candidate``): its share of the orthogonalisation and its gathers' volume (zero for
    AdamW); ``gather_s`` is left to the cost model's collective formulas."""
    if workload.optimizer != "muon":
        return MuonCost()
    data = c.data_size
    fsdp = c.zero_stage >= 3
    mesh = (data if fsdp else 1) * c.tp  # the ranks a dense matrix is sharded over
    groups = model.layer_groups(layers)
    dense = experts = 0.0
    for i, n in groups:
        d, e = layer_ns_flops(model, i, steps=workload.ns_steps)
        dense, experts = dense + n * d, experts + n * e
    spread = workload.muon_gather == "spread"
    flops = (dense / mesh if spread else dense) + experts / c.ep / (data // c.ep if fsdp else 1)
    sharded = sum(n * layer_split_matrix_params(model, i) for i, n in groups) if mesh > 1 else 0.0
    if fsdp:
        sharded += sum(n * layer_shared_params(model, i) for i, n in groups)
    w, g, k = workload.muon_bytes_per_param
    inner = [n for n in reversed(mesh_names()) if (n == "tp" or n in data_names()) and c.size(n) > 1]
    link = hardware.link_for(span=mesh, stride=c.stride(inner[0] if inner else "dp"))  # its innermost dimension
    if spread:
        out, back = sharded / mesh * (w + g + k), sharded / mesh * (w + k)
    else:
        out, back = sharded * (w + g + k), 0.0
    sent = (mesh - 1) / mesh * (out + back) if mesh > 1 else 0.0
    return MuonCost(
        ns_flops=flops,
        ns_s=flops / hardware.flops,
        gather_bytes=sent,
        mesh=mesh,
        link=link,
        spread=spread,
        out_bytes=out,
        back_bytes=back,
    )
