"""transformers' MoE experts behind meshtrain's dispatch seam (``models/moe.py``'s ``LocalDispatch``), so expert
parallel (``parallel/techniques/ep.py``) splits them as it splits meshtrain's own.

transformers 5's MoE families call one module per layer, ``experts(hidden_states, top_k_index, top_k_weights)``, over
stacked weights whose dim 0 is the expert (Mixtral's and DeepSeek-V3's ``gate_up_proj`` / ``down_proj``, gpt-oss's
with biases). ``install`` gives each such module a ``dispatcher`` and a forward that routes through it: the
(token, choice) rows sorted by expert (``dispatch``; under expert parallel, sent to the rank owning the expert by
all-to-all), each local expert run by transformers' own (eager) forward on its rows (one choice per row, weight 1), and the
outputs weighed and summed into their tokens (``combine``), in transformers' order: expert by expert, token by token.
Why this seam and not transformers' ``base_model_ep_plan``: that plan's styles (``grouped_gemm``,
``ep_dispatch_experts``) shard for transformers' own distributed loading and inference; meshtrain's dispatch already
carries the uneven all-to-all, its gradient scaling under FSDP2 over the experts' own mesh and the timers, and is
held to single by the qwen3_moe parity tests, so the architecture's experts only need to be run behind it.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.utils.stateless import _reparametrize_module

from models.moe import LocalDispatch, even_split, has_values


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """transformers' experts modules: a module named ``experts`` whose own parameters stack one tensor per expert."""
    out = []
    for name, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        n = getattr(module, "num_experts", None)
        if name.rsplit(".", 1)[-1] == "experts" and params and n and all(p.shape[0] == n for p in params):
            out.append(module)
    return out


def install(model: nn.Module) -> int:
    """Put every experts module of ``model`` behind a ``LocalDispatch``; returns how many."""
    found = expert_modules(model)
    for module in found:
        module.dispatcher = LocalDispatch(int(module.num_experts))
        module.n_experts = int(module.num_experts)
        module.forward = types.MethodType(seam_forward, module)
    return len(found)


def seam_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    routed = self.dispatcher.dispatch(hidden_states, top_k_index, top_k_weights)
    local = {n: p.to_local() if isinstance(p, DTensor) else p for n, p in self.named_parameters(recurse=False)}
    rows, experts = routed.rows.shape[0], routed.counts.shape[0]  # this rank's experts (all without ep)
    measured = has_values(routed.counts)
    counts = routed.counts if measured else torch.tensor(even_split(rows, experts), device=routed.rows.device)
    which = torch.repeat_interleave(torch.arange(experts, device=routed.rows.device), counts, output_size=rows)
    which = which[:, None]
    ones = torch.ones_like(which, dtype=routed.rows.dtype)
    with _reparametrize_module(self, local):
        y = experts_forward(self, measured=measured)(self, routed.rows, which, ones)
    # weighed and summed in the wider dtype (fp32 router weights), returned in the block input's, as transformers does
    return self.dispatcher.combine(y, routed, hidden_states.shape[0]).to(hidden_states.dtype)


def experts_forward(module: nn.Module, *, measured: bool):
    """transformers' eager loop over the experts (not the kernel ``use_experts_implementation`` picks), whose choice
    of experts reads the routing; where nothing can be read (fake tensors: the planner's dry run, with balanced
    routing) transformers' grouped forward, which runs the same rows through the same gate and projections as one
    grouped matmul per projection and keeps for backward what the loop keeps: each row's input, its gate/up
    projection, the gated product and the expert's output."""
    if not measured:
        return _grouped_shapes
    forward = type(module).forward
    return getattr(forward, "__wrapped__", forward)


def _grouped_shapes(module: nn.Module, rows: torch.Tensor, which: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped experts forward through its own fallback grouped matmul (a custom op with a shape
    function; torch's ``grouped_mm`` on CPU takes bf16 only), for fake tensors; its rows then added into the output
    by ``index_add_`` as the loop adds each expert's, which autograd keeps as the loop's are kept."""
    from unittest import mock

    from transformers.integrations import moe

    local = module.down_proj.shape[0]  # this rank's experts under expert parallel
    with (
        mock.patch.object(moe, "_can_use_grouped_mm", lambda *_: False),
        mock.patch.object(module, "num_experts", local),
    ):
        out = moe.grouped_mm_experts_forward(module, rows, which, weights)
    return torch.zeros_like(out).index_add_(0, torch.arange(out.shape[0], device=out.device), out)
