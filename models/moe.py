"""A mixture-of-experts feed-forward block: a softmax top-k router, SwiGLU experts stored stacked, optional shared
experts, and the two ways of keeping experts balanced.

The block runs in four steps, each its own piece so that expert parallel can later replace the middle two:

1. ``Router``: softmax over ``E`` experts in fp32, the top ``k`` per token (Qwen3-MoE's ``norm_topk_prob``
   renormalises the k weights to sum to 1). DeepSeek-V3's auxiliary-loss-free balancing adds a per-expert bias to
   the scores for the *choice* only (``expert_bias``, updated outside autograd by ``update_expert_bias``). Its
   ``Routing`` (DeepSeek-V3): sigmoid scores, the choice limited to the ``topk_group`` best of ``n_group`` expert
   groups, the weights times ``route_scale``.
2. ``LocalDispatch.dispatch``: the (token, choice) pairs sorted by expert, the rows gathered, the count per expert;
   with ``capacity_factor`` each expert keeps at most ``ceil(factor x tokens x k / E)`` rows (in token order) and
   the rest are dropped and counted (a dropped choice adds nothing; the residual stream carries the token on).
3. ``GroupedExperts``: every expert's SwiGLU over its contiguous rows, with ``torch._grouped_mm`` on CUDA and a
   loop of per-expert matmuls elsewhere (the same products; torch 2.13's CPU ``_grouped_mm`` has no backward).
4. ``LocalDispatch.combine``: each row scaled by its router weight and summed back into its token.

Expert weights are stacked like ``nn.Linear`` weights, one per expert: ``w1``, ``w3`` are (E, ff, d) and ``w2`` is
(E, d, ff), so expert e computes ``w2[e] @ (silu(w1[e] @ x) * (w3[e] @ x))``, and a published checkpoint's
per-expert ``gate_proj`` / ``up_proj`` / ``down_proj`` are the slices ``w1[e]`` / ``w3[e]`` / ``w2[e]``. An FSDP2
shard of dim 0 is a set of whole experts.

**The load-balancing loss** (Switch Transformer, arXiv 2101.03961 eq. 4-6; transformers' Qwen3-MoE
``router_aux_loss_coef``): ``E x sum_i f_i P_i`` per layer, ``f_i`` the fraction of tokens whose top-k holds
expert i and ``P_i`` the mean router probability of expert i. Its gradient joins backward through the block's
output (Megatron-core's ``MoEAuxLossAutoScaler``): the LM loss the engines compute and report stays the LM loss,
whatever the layout, including pipeline stages that never see the last layer. ``aux_loss_scale`` (set by
``set_aux_loss_scale``) must be the factor the engine scales the LM loss by (1 / micro-batches per step). The
value of the last forward is in ``last_stats`` (``moe_metrics`` reads every layer's).

DeepSeek-V3's **sequence-wise** loss (``aux_loss="sequence"``, ``sequence_balance_loss``) is the same product per
sequence, over the scores normalised per token, averaged over the sequences: it needs no ranks but the cp ranks
holding parts of a sequence (``sequence_group``), so no layout changes it.

**Its scope** (``balance_scope``): ``global`` takes f over the tokens of every rank that runs the same micro-batch
at once, the data-parallel and context-parallel ranks (``balance_group``, set by
``parallel/techniques/moe_balance.py``): f from the counts summed over them, P from the rank's own tokens, so the
ranks' losses average to the loss of their tokens taken together, and the data-parallel degree no longer changes
what the router is trained on (with one micro-batch per step, dp x ep equals one process running the whole batch).
``micro_batch`` takes f over one forward's sequences (transformers' and Megatron-core's default): the context-
parallel ranks' counts only, which hold parts of the same sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from models.blocks import SwiGLU
from models.spec import BALANCE_SCOPES

#: ``expert_impl`` choices: auto (grouped_mm on CUDA, the loop elsewhere), grouped_mm, loop
EXPERT_IMPLS = ("auto", "grouped_mm", "loop")


@dataclass(frozen=True)
class Routing:
    """How a router scores and picks: Qwen3-MoE's softmax top-k by default; DeepSeek-V3's sigmoid scores, picked
    within the ``topk_group`` best of ``n_group`` expert groups, weighed times ``route_scale``."""

    score_func: str = "softmax"
    """softmax over the experts, or an independent sigmoid per expert (DeepSeek-V3)."""
    n_group: int = 1
    """Expert groups (contiguous, equal); a group's score is the sum of its two best (biased) scores."""
    topk_group: int = 1
    """Groups a token may pick its experts from (DeepSeek-V3's node limit)."""
    route_scale: float = 1.0
    """The chosen experts' weights multiplied by it, after the renormalisation."""


#: ``Routing.score_func`` choices
SCORE_FUNCS = ("softmax", "sigmoid")


class Router(nn.Module):
    """Token -> k experts and their weights. ``weight`` is (E, d), transformers' ``mlp.gate.weight``."""

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        top_k: int,
        *,
        norm_topk_prob: bool,
        score_bias: bool,
        routing: Routing = Routing(),
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"model.top_k={top_k}: each token picks 1 to model.n_experts={n_experts} experts")
        if routing.score_func not in SCORE_FUNCS:
            raise ValueError(f"model.score_func={routing.score_func}: choose one of {', '.join(SCORE_FUNCS)}")
        if n_experts % routing.n_group or not 1 <= routing.topk_group <= routing.n_group:
            raise ValueError(
                f"model.n_group={routing.n_group}, model.topk_group={routing.topk_group}: groups must divide "
                f"model.n_experts={n_experts} and 1 <= topk_group <= n_group"
            )
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.routing = routing
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))
        # DeepSeek-V3's balancing bias: picks experts, never weighs them; a buffer (no gradient, in checkpoints)
        self.register_buffer("expert_bias", torch.zeros(n_experts) if score_bias else None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scores (T, E) fp32, chosen experts (T, k), their weights (T, k) in x's dtype)."""
        sigmoid = self.routing.score_func == "sigmoid"
        # DeepSeek-V3 scores in fp32 from fp32 inputs (transformers keeps the gate in fp32)
        probs = F.linear(x.float(), self.weight.float()).sigmoid() if sigmoid else F.linear(x, self.weight).float()
        probs = probs if sigmoid else probs.softmax(dim=-1)
        choose = probs if self.expert_bias is None else probs + self.expert_bias
        if self.routing.n_group > 1:
            choose = _within_best_groups(choose, self.routing.n_group, self.routing.topk_group)
        idx = choose.topk(self.top_k, dim=-1).indices
        weights = probs.gather(-1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if sigmoid else 0.0))
        if self.routing.route_scale != 1.0:
            weights = weights * self.routing.route_scale
        return probs, idx, weights.to(x.dtype)


def _within_best_groups(scores: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """``scores`` (T, E) with every expert outside the token's ``topk_group`` best groups at -inf; a group's score is
    the sum of its two best (DeepSeek-V3's node-limited routing, transformers' ``DeepseekV3TopkRouter``)."""
    grouped = scores.view(scores.shape[0], n_group, -1)
    best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)  # (T, groups)
    keep = torch.zeros_like(best).scatter_(1, best.topk(topk_group, dim=-1).indices, 1.0).bool()
    return grouped.masked_fill(~keep[..., None], float("-inf")).view_as(scores)


@dataclass
class Routed:
    """What ``dispatch`` hands the experts and ``combine`` needs back."""

    rows: torch.Tensor
    """(N, d): the kept (token, choice) rows, grouped by expert in expert order."""
    counts: torch.Tensor
    """(E,) int64: rows per expert (sums to N)."""
    token: torch.Tensor
    """(N,): the token each row came from."""
    weight: torch.Tensor
    """(N,): its router weight."""
    dropped: torch.Tensor
    """(): (token, choice) pairs over capacity, not computed."""


class LocalDispatch:
    """Every expert on this rank: a sort by expert and a gather, and its inverse. Expert parallel replaces it with
    an all-to-all dispatch of the same ``Routed`` rows (the seam: ``dispatch`` / ``combine``)."""

    def __init__(self, n_experts: int, capacity_factor: float = 0.0):
        self.n_experts = n_experts
        self.capacity_factor = capacity_factor

    def capacity(self, tokens: int, top_k: int) -> int | None:
        """Rows an expert keeps; None: no limit (``capacity_factor`` 0)."""
        if not self.capacity_factor:
            return None
        return math.ceil(self.capacity_factor * tokens * top_k / self.n_experts)

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Routed:
        tokens, k = idx.shape
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)  # by expert, then token, then choice: transformers' summation order
        counts = expert_counts(flat, self.n_experts)
        dropped = torch.zeros((), dtype=torch.long, device=x.device)
        limit = self.capacity(tokens, k)
        if limit is not None:
            starts = counts.cumsum(0) - counts
            rank_in_expert = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
            keep = rank_in_expert < limit
            order, kept = order[keep], counts.clamp(max=limit)
            dropped = (counts - kept).sum()
            counts = kept
        token = order // k
        return Routed(rows=x[token], counts=counts, token=token, weight=weights.reshape(-1)[order], dropped=dropped)

    def combine(self, y: torch.Tensor, routed: Routed, tokens: int) -> torch.Tensor:
        """Each token's rows weighed and summed in the wider of the experts' and the weights' dtype (under autocast
        bf16 rows, fp32 weights: summed in fp32, as transformers sums in the block input's dtype)."""
        weighed = y * routed.weight[:, None]
        return weighed.new_zeros(tokens, y.shape[-1]).index_add_(0, routed.token, weighed)


class GroupedExperts(nn.Module):
    """E SwiGLU experts, stacked: ``w1``, ``w3`` (E, ff, d), ``w2`` (E, d, ff)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, *, impl: str = "auto"):
        super().__init__()
        if impl not in EXPERT_IMPLS:
            raise ValueError(f"model.expert_impl={impl}: choose one of {', '.join(EXPERT_IMPLS)}")
        self.impl = impl
        self.w1 = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.w2 = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.w3 = nn.Parameter(torch.empty(n_experts, d_ff, d_model))

    def use_grouped_mm(self, rows: torch.Tensor) -> bool:
        if self.impl != "auto":
            return self.impl == "grouped_mm"
        return rows.is_cuda and hasattr(torch, "_grouped_mm")

    def forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # under expert parallel the weights are DTensors sharded by expert: this rank's experts are the local part
        # (an isinstance test: torch.compile traced ``getattr(w, "to_local", default)`` as the default, torch 2.13)
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w1, self.w2, self.w3))
        if self.use_grouped_mm(rows):
            offs = counts.cumsum(0).to(torch.int32)
            h = F.silu(torch._grouped_mm(rows, w1.transpose(-2, -1), offs=offs))
            h = h * torch._grouped_mm(rows, w3.transpose(-2, -1), offs=offs)
            return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
        return _looped_experts(rows, counts, w1, w2, w3)


@torch.compiler.disable
def _looped_experts(rows: torch.Tensor, counts: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """One SwiGLU per expert over its rows, run eagerly also inside a compiled block: the rows per expert are host
    values (``counts.tolist()``), which dynamo would trace as a graph break, then recompile for every new count."""
    sizes = counts.tolist() if has_values(counts) else even_split(rows.shape[0], counts.shape[0])
    parts = rows.split(sizes)
    out = [F.linear(F.silu(F.linear(p, w1[e])) * F.linear(p, w3[e]), w2[e]) for e, p in enumerate(parts)]
    return torch.cat(out) if out else rows[:0]


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on ``out``; backward also sends ``scale`` as the gradient of ``aux`` (Megatron-core's
    ``MoEAuxLossAutoScaler``): the auxiliary loss trains the router without entering the reported LM loss."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


@torch._dynamo.disable
def _attach_aux_loss(out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
    """``_AttachAuxLoss`` run eagerly, also inside a compiled block: traced by torch.compile (torch 2.13) the
    function's gradient for ``aux``, which its output does not depend on, was dropped, so the load-balancing loss
    trained nothing under ``trainer.compile=true``. One graph break per MoE layer (the dispatch has others)."""
    return _AttachAuxLoss.apply(out, aux, scale)


def expert_counts(idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(E,) int64: how often each expert is chosen. A scatter-add rather than ``bincount``, which has no meta kernel
    (the planner's dry run builds and runs the model on the meta device)."""
    flat = idx.reshape(-1)
    return torch.zeros(n_experts, dtype=torch.long, device=idx.device).scatter_add_(0, flat, torch.ones_like(flat))


def has_values(t: torch.Tensor) -> bool:
    """False on the meta device and under a fake tensor mode (the planner's dry run), where nothing can be read."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type != "meta" and not is_fake(t)


def even_split(rows: int, parts: int) -> list[int]:
    """Balanced routing's rows per expert, where the counts have no values (``has_values``: the dry run's shapes)."""
    base, extra = divmod(rows, parts)
    return [base + (i < extra) for i in range(parts)]


def load_balancing_loss(
    probs: torch.Tensor, idx: torch.Tensor, *, counts: torch.Tensor | None = None, tokens: int | None = None
) -> torch.Tensor:
    """Switch's ``E x sum_i f_i P_i`` (transformers' ``load_balancing_loss_func`` for one layer): 1 when balanced.
    ``counts`` / ``tokens``: the expert counts and the token count of every rank's tokens the balance covers when
    ``probs`` are one rank's share of them (``MoE.balance_scope``): f over them all, P over the share, so the
    shares' losses average to the loss of all of them, and so do their gradients."""
    n_experts = probs.shape[-1]
    if counts is None:
        counts, tokens = expert_counts(idx, n_experts), idx.shape[0]
    f = counts.to(probs.dtype) / tokens
    return n_experts * (f * probs.mean(dim=0)).sum()


def sequence_balance_loss(
    probs: torch.Tensor, idx: torch.Tensor, *, batch: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss (arXiv 2412.19437, eq. 17-20): per sequence ``sum_i f_i P_i``, ``f_i``
    = E / (k T) x the sequence's tokens choosing expert i, ``P_i`` the sequence's mean of the scores normalised over
    the experts; the mean over the ``batch`` sequences (1 when balanced). ``probs`` (batch x T, E) are the router's
    scores. ``group``: the ranks holding the other parts of the same sequences (context parallel), whose counts are
    summed, so the ranks' losses average to the whole sequences' loss."""
    tokens, n_experts = probs.shape
    k, per_seq = idx.shape[-1], tokens // batch
    picks = idx.reshape(batch, -1)
    counts = probs.new_zeros(batch, n_experts).scatter_add_(1, picks, probs.new_ones(picks.shape))
    seq_len = per_seq
    if group is not None:
        counts, seq_len = _over_group(counts, group, seq_len=per_seq)
    f = counts * (n_experts / (k * seq_len))
    p = (probs / probs.sum(dim=-1, keepdim=True)).view(batch, per_seq, n_experts).mean(dim=1)
    return (f * p).sum(dim=-1).mean()


#: ``MoE.aux_loss`` choices: Switch's over the balance's tokens, DeepSeek-V3's per sequence
AUX_LOSSES = ("switch", "sequence")


class MoE(nn.Module):
    """The feed-forward of a sparse block: ``shared(x) + sum_k w_k expert_k(x)``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        n_experts: int,
        top_k: int,
        norm_topk_prob: bool = True,
        n_shared_experts: int = 0,
        aux_loss_coef: float = 0.0,
        bias_update_rate: float = 0.0,
        capacity_factor: float = 0.0,
        expert_impl: str = "auto",
        balance_scope: str = "global",
        aux_loss: str = "switch",
        routing: Routing = Routing(),
        score_bias: bool | None = None,
    ):
        super().__init__()
        if capacity_factor < 0:
            raise ValueError(f"model.capacity_factor={capacity_factor}: 0 (no limit) or a positive factor")
        if balance_scope not in BALANCE_SCOPES:
            raise ValueError(f"model.balance_scope={balance_scope}: choose one of {', '.join(BALANCE_SCOPES)}")
        if aux_loss not in AUX_LOSSES:
            raise ValueError(f"MoE(aux_loss={aux_loss!r}): choose one of {', '.join(AUX_LOSSES)}")
        self.balance_scope = balance_scope
        self.aux_loss = aux_loss
        self.n_experts, self.top_k = n_experts, top_k
        self.aux_loss_coef = aux_loss_coef
        self.aux_loss_scale = 1.0
        """The factor the engine scales the LM loss by (``set_aux_loss_scale``)."""
        self.bias_update_rate = bias_update_rate
        self.router = Router(
            d_model,
            n_experts,
            top_k,
            norm_topk_prob=norm_topk_prob,
            score_bias=bias_update_rate > 0 if score_bias is None else score_bias,
            routing=routing,
        )
        self.experts = GroupedExperts(d_model, d_ff, n_experts, impl=expert_impl)
        self.shared = SwiGLU(d_model, d_ff * n_shared_experts) if n_shared_experts else None
        self.dispatcher = LocalDispatch(n_experts, capacity_factor)
        self.last_stats: dict[str, torch.Tensor] = {}
        self.step_stats: torch.Tensor | None = None
        """Training forwards since ``moe_metrics`` last read them: (aux loss sum, forwards, dropped, counts per
        expert...), float64."""
        self.tokens_per_expert = None  # counts since the last bias update (a plain tensor: DDP broadcasts buffers)
        self.balance_group = None
        """The process group whose ranks' tokens the load-balancing loss's counts cover (``balance_scope``; set by
        ``parallel/techniques/moe_balance.py``); None: this forward's tokens alone."""
        self.sequence_group = None
        """The ranks holding parts of the same sequences (context parallel's cp group; set by
        ``parallel/techniques/moe_balance.py``): the sequence-wise loss sums its per-sequence counts over them."""
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float = 0.02) -> None:
        """The router and the input projections (w1) N(0, std); w2 and w3, which feed the residual stream or gate
        it, N(0, out_std) (``models/init.py`` passes Llama's depth-scaled value)."""
        if self.experts.w1.is_meta:  # nothing to draw on the meta device (``models/init.py`` ``holds_values``)
            return
        for w in (self.router.weight, self.experts.w1):
            nn.init.normal_(w, mean=0.0, std=std)
        for w in (self.experts.w2, self.experts.w3):
            nn.init.normal_(w, mean=0.0, std=out_std)
        if self.router.expert_bias is not None:
            self.router.expert_bias.zero_()
        if self.shared is not None:
            nn.init.normal_(self.shared.w1.weight, mean=0.0, std=std)
            for lin in (self.shared.w2, self.shared.w3):
                nn.init.normal_(lin.weight, mean=0.0, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs, idx, weights = self.router(flat)
        routed = self.dispatcher.dispatch(flat, idx, weights)
        y = self.dispatcher.combine(self.experts(routed.rows, routed.counts), routed, flat.shape[0])
        if self.shared is not None:
            y = y + self.shared(flat)
        counts = expert_counts(idx, self.n_experts).detach()
        aux = self._balance_loss(probs, idx, counts, batch=shape[0] if len(shape) == 3 else 1)
        self._count(aux.detach(), counts, routed.dropped)
        if self.training and self.aux_loss_coef and torch.is_grad_enabled():
            y = _attach_aux_loss(y, aux, self.aux_loss_coef * self.aux_loss_scale)
        return y.reshape(shape)

    @torch.compiler.disable
    def _count(self, aux: torch.Tensor, counts: torch.Tensor, dropped: torch.Tensor) -> None:
        """The forward's balance into the step's counters, run eagerly also inside a compiled block (bookkeeping on
        the module's attributes, and a test of autograd's state that dynamo cannot trace)."""
        self.last_stats = {"aux_loss": aux, "tokens_per_expert": counts, "dropped": dropped}
        counted = self.training and not _in_backward()  # activation checkpointing's recompute counts nothing twice
        if counted:
            row = torch.cat([torch.stack([aux.double(), aux.new_ones((), dtype=torch.float64), dropped.double()]),
                             counts.double()])  # fmt: skip
            self.step_stats = row if self.step_stats is None else self.step_stats + row
        if counted and self.router.expert_bias is not None:
            self.tokens_per_expert = counts if self.tokens_per_expert is None else self.tokens_per_expert + counts

    def _balance_loss(self, probs: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor, *, batch: int):
        if self.aux_loss == "sequence":
            return sequence_balance_loss(probs, idx, batch=batch, group=self.sequence_group)
        return load_balancing_loss(probs, idx, **self._whole_forward(counts, tokens=probs.shape[0]))

    @torch.compiler.disable
    def _whole_forward(self, counts: torch.Tensor, *, tokens: int) -> dict:
        """The expert counts and token count the balance covers, summed over ``balance_group`` (nothing to sum
        without one, or on the dry run's shapes). With the loss off (``aux_loss_coef`` 0) it is only reported, over
        this rank's tokens: no collective (the sum was one all-reduce per MoE layer in the middle of every forward, 4
        per step on benchmarks/vs_torchtitan.py's qwen3 MoE under dp2 x ep2, where torchtitan, balancing off, counts
        nothing). Run eagerly also inside a compiled block (a collective and host tests)."""
        if self.balance_group is None or not self.aux_loss_coef or not has_values(counts):
            return {}
        return {
            "counts": _summed(counts, self.balance_group),
            "tokens": tokens * dist.get_world_size(self.balance_group),
        }


@torch.compiler.disable
def _over_group(counts: torch.Tensor, group: dist.ProcessGroup, *, seq_len: int) -> tuple[torch.Tensor, int]:
    """Per-sequence counts and length summed over the ranks holding the sequences' other parts, run eagerly also
    inside a compiled block (nothing to sum on the dry run's shapes)."""
    if not has_values(counts):
        return counts, seq_len
    return _summed(counts, group), seq_len * dist.get_world_size(group)


@torch.compiler.disable
def _summed(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``counts`` all-reduced over ``group`` (E integers), run eagerly also inside a compiled block."""
    whole = counts.clone()
    dist.all_reduce(whole, group=group)
    return whole


def _in_backward() -> bool:
    """Inside autograd's backward: activation checkpointing recomputing a forward."""
    return torch._C._current_graph_task_id() != -1


@contextmanager
def uncounted(module: nn.Module) -> Iterator[None]:
    """Forwards inside leave ``module``'s MoE counters (the step's balance, the bias balancing's counts, the last
    forward's stats) as they were: a forward that is no training step's (torch's pipeline shape inference runs
    one at the first step, on the first micro-batch or on empty tensors)."""
    layers = moe_layers(module)
    kept = [(m.step_stats, m.tokens_per_expert, m.last_stats) for m in layers]
    try:
        yield
    finally:
        for m, (step_stats, tokens, last) in zip(layers, kept, strict=True):
            m.step_stats, m.tokens_per_expert, m.last_stats = step_stats, tokens, last


def moe_layers(module: nn.Module) -> list[MoE]:
    return [m for m in module.modules() if isinstance(m, MoE)]


def dispatch_seams(module: nn.Module) -> list[nn.Module]:
    """Every module that routes through a ``LocalDispatch`` (its ``dispatcher``, its ``n_experts``): meshtrain's
    ``MoE`` blocks, and modules run behind the seam whose own parameters stack the experts (the Hugging Face
    backend's, ``models/hf_transformers/experts.py``). Expert parallel replaces their dispatcher."""
    return [m for m in module.modules() if isinstance(getattr(m, "dispatcher", None), LocalDispatch)]


def stacked_experts(block: nn.Module) -> nn.Module:
    """The module holding a seam's stacked expert weights (dim 0: the expert): a ``MoE``'s ``experts``, else the
    module itself."""
    return block.experts if isinstance(block, MoE) else block


def set_aux_loss_scale(module: nn.Module, scale: float) -> None:
    """Tell every MoE block how the engine scales each forward's loss (1 / micro-batches per optimizer step), so
    the auxiliary loss's gradient is ``coef x`` the step's mean, as the LM loss's is."""
    for m in moe_layers(module):
        m.aux_loss_scale = float(scale)


@torch.no_grad()
def update_expert_bias(module: nn.Module, *, reduce: Callable[[torch.Tensor], None] | None = None) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437, section 2.1.2), once per optimizer step:
    each expert's bias moves by ``bias_update_rate`` towards the mean load (up when under-loaded, down when over).
    ``reduce`` sums the counts over the data-parallel ranks in place (every replica must move its bias alike)."""
    for m in moe_layers(module):
        if m.router.expert_bias is None or m.tokens_per_expert is None:
            continue
        counts = m.tokens_per_expert.float()
        if reduce is not None:
            reduce(counts)
        m.router.expert_bias += m.bias_update_rate * torch.sign(counts.mean() - counts)
        m.tokens_per_expert = None


def moe_step_table(
    module: nn.Module, *, reduce: Callable[[torch.Tensor], None] | None = None
) -> tuple[list[str], torch.Tensor] | None:
    """The training forwards since the last call (one optimizer step's), per MoE block of ``module``: its layer key
    (``layer3``) and a float64 row (aux loss sum, forwards, dropped, tokens per expert...), taken (the blocks start
    over). ``reduce`` sums the table over the data-parallel ranks in place (every rank must call it), so the numbers
    are the global batch's whatever the layout; None: this rank's forwards. None when no block ran."""
    named = [(name, m) for name, m in module.named_modules() if isinstance(m, MoE) and m.step_stats is not None]
    if not named:
        return None
    table = torch.stack([m.step_stats for _, m in named])  # (layers, 3 + E)
    for _, m in named:
        m.step_stats = None
    if reduce is not None:
        reduce(table)
    return [layer_key(name) for name, _ in named], table.cpu()


def imbalance(counts: torch.Tensor) -> torch.Tensor:
    """Per row of tokens per expert: max / mean (1 when balanced, E when one expert takes every token)."""
    return counts.max(dim=-1).values / counts.mean(dim=-1).clamp(min=1e-9)


def moe_metrics(module: nn.Module, *, reduce: Callable[[torch.Tensor], None] | None = None) -> dict[str, float]:
    """``moe_step_table`` as metrics: the auxiliary loss (unscaled) averaged over forwards and layers, each layer's
    load imbalance (``moe_imbalance_<layer>``) and the worst, the (token, choice) pairs dropped over capacity."""
    taken = moe_step_table(module, reduce=reduce)
    return {} if taken is None else balance_metrics(*taken)


def balance_metrics(layers: list[str], table: torch.Tensor) -> dict[str, float]:
    ratio = imbalance(table[:, 3:])
    out = {
        "moe_aux_loss": float((table[:, 0] / table[:, 1]).mean()),
        "moe_max_imbalance": float(ratio.max()),
        "moe_dropped_tokens": float(table[:, 2].sum()),
    }
    for layer, value in zip(layers, ratio.tolist(), strict=True):
        out[f"moe_imbalance_{layer}"] = value
    return out


def layer_key(name: str) -> str:
    """``layers.3.feed_forward`` -> ``layer3`` (a pipeline stage keeps the whole model's layer keys)."""
    parts = name.split(".")
    return f"layer{parts[parts.index('layers') + 1]}" if "layers" in parts[:-1] else name.replace(".", "_")
