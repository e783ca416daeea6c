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

from models.moe import LocalDispatch


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
    experts = routed.counts.shape[0]  # this rank's (all of them without expert parallel)
    which = torch.repeat_interleave(torch.arange(experts, device=routed.rows.device), routed.counts)[:, None]
    ones = torch.ones_like(which, dtype=routed.rows.dtype)
    forward = type(self).forward
    forward = getattr(
        forward, "__wrapped__", forward
    )  # the eager loop, not the kernel use_experts_implementation picks
    with _reparametrize_module(self, local):
        y = forward(self, routed.rows, which, ones)
    # weighed and summed in the wider dtype (fp32 router weights), returned in the block input's, as transformers does
    return self.dispatcher.combine(y, routed, hidden_states.shape[0]).to(hidden_states.dtype)
