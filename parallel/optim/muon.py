"""``optim=muon``: torch's Muon for the blocks' weight matrices, torch's AdamW for everything else, as one optimizer.

**Who gets Muon** (``muon_role``): a parameter with two or more dimensions inside a block (``layers.<i>.``, the name
every decoder family gives its blocks), except a MoE router's weight. Embeddings, the output head, norms, biases and
routers (a ``router`` or ``gate`` module) go to AdamW, as Keller Jordan's Muon and Moonshot's recipe do. An
experts' 3-D tensor is one matrix per expert (``parallel/optim/muon_shards.py``). LoRA is refused before any worker starts (``trainer/checks/optim.py``).

**One torch optimizer.** ``Muon`` is a ``torch.optim.Optimizer`` whose param groups carry ``role`` (muon or adamw),
each with its own ``lr`` and ``weight_decay``; its ``state`` holds Muon's ``momentum_buffer`` and AdamW's moments
under each parameter, so DCP saves and reshards both by parameter name like any optimizer's, and the lr schedule
scales every group from its own base. AdamW's groups are stepped by a ``torch.optim.AdamW`` built over them (grouped
by kind with ``optim.implementation``'s kernels, ``parallel/foundation/optimizer.py``) that shares this optimizer's groups
and state; Muon's by torch's functional Muon step on whole matrices (``muon_shards``).

``optim.muon_gather`` picks how sharded matrices become whole: ``spread`` (each matrix orthogonalised by one owner,
gathered to it and scattered back) or ``everywhere`` (every rank gathers and orthogonalises every matrix).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import torch
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, DEFAULT_NS_STEPS, EPS

from parallel.foundation.optimizer import build_optimizer_over, param_groups_by_kind
from parallel.optim.muon_keys import GATHER_WAYS
from parallel.optim.muon_shards import SpreadStep, held_whole, local_matrices, step_gathered_everywhere

#: torch's defaults for the orthogonalisation, read from torch
NS_DEFAULTS = {"ns_coefficients": (DEFAULT_A, DEFAULT_B, DEFAULT_C), "eps": EPS, "ns_steps": DEFAULT_NS_STEPS}

#: a MoE router's module name: meshtrain's (``models/moe.py``) and transformers' (``mlp.gate``, beside ``gate_proj``)
ROUTER_NAMES = {"router", "gate"}

_BLOCK = re.compile(r"(^|\.)layers\.\d+\.")


def muon_role(name: str, param: torch.Tensor) -> str:
    """``muon`` for a block's weight matrix (2-D, or an experts' 3-D tensor), else ``adamw``."""
    in_block = _BLOCK.search(name) is not None
    router = bool(ROUTER_NAMES & set(name.split(".")))
    return "muon" if param.ndim >= 2 and in_block and not router else "adamw"


class Muon(torch.optim.Optimizer):
    """Muon (torch's update) over the blocks' matrices and AdamW over the rest; see the module docstring.

    ``named_params``: (name, parameter) pairs, the names as the model's ``named_parameters`` gives them."""

    takes_names = True

    def __init__(
        self,
        named_params: Iterable[tuple[str, torch.Tensor]],
        *,
        lr: float = 0.02,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: Iterable[float] = NS_DEFAULTS["ns_coefficients"],
        eps: float = NS_DEFAULTS["eps"],
        ns_steps: int = NS_DEFAULTS["ns_steps"],
        adjust_lr_fn: str = "original",
        adamw_lr: float = 3e-3,
        adamw_weight_decay: float = 0.0,
        adamw_betas: Iterable[float] = (0.9, 0.95),
        adamw_eps: float = 1e-8,
        muon_gather: str = "spread",
        implementation: str = "auto",
    ) -> None:
        named = list(named_params)
        muon_params = [p for n, p in named if muon_role(n, p) == "muon"]
        adamw_params = [p for n, p in named if muon_role(n, p) == "adamw"]
        if not muon_params:
            raise ValueError("optim=muon: no block weight matrix to orthogonalise (layers.<i>.*, 2-D or 3-D)")
        if muon_gather not in GATHER_WAYS:
            raise ValueError(f"optim.muon_gather={muon_gather}: use one of {', '.join(GATHER_WAYS)}")
        settings = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(float(c) for c in ns_coefficients),
            "eps": eps,
            "ns_steps": int(ns_steps),
            "adjust_lr_fn": adjust_lr_fn,
        }
        # torch's own checks of every setting (lr, momentum, weight decay, adjust_lr_fn) on a stand-in matrix
        torch.optim.Muon([torch.zeros(1, 1)], **settings)
        groups = [{**g, **settings, "role": "muon"} for g in param_groups_by_kind(muon_params)]
        self._adamw = None
        if adamw_params:
            factory = functools.partial(
                torch.optim.AdamW,
                lr=adamw_lr,
                weight_decay=adamw_weight_decay,
                betas=tuple(adamw_betas),
                eps=adamw_eps,
            )
            self._adamw = build_optimizer_over(factory, adamw_params, implementation=implementation)
            groups += [{**g, "role": "adamw"} for g in self._adamw.param_groups]
        super().__init__(groups, defaults={})
        self.muon_gather = muon_gather
        self._spread = SpreadStep()

    def _link_adamw(self) -> None:
        """The inner AdamW steps this optimizer's AdamW groups and state (they are replaced by ``load_state_dict``)."""
        self._adamw.param_groups = [g for g in self.param_groups if g["role"] == "adamw"]
        self._adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["role"] == "muon":
                self._step_muon(group)
        if self._adamw is not None:
            self._link_adamw()
            self._adamw.step()
        return loss

    def allocate_state(self) -> None:
        """The state a first step creates, without stepping (the planner's dry run, on meta tensors): each Muon
        matrix's momentum buffer, and AdamW's moments by a step of the AdamW part."""
        for group in self.param_groups:
            if group["role"] == "muon":
                for p in group["params"]:
                    self.state[p].setdefault(
                        "momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format)
                    )
        if self._adamw is not None:
            self._link_adamw()
            self._adamw.step()

    def _step_muon(self, group: dict) -> None:
        whole, sharded = [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            entry = (p, p.grad, state["momentum_buffer"])
            (whole if held_whole(p) else sharded).append(entry)
        local_matrices(whole, group)
        if sharded:
            (self._spread if self.muon_gather == "spread" else step_gathered_everywhere)(sharded, group)
