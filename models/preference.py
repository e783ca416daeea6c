"""Preference objectives on pairs of sequences: DPO (the sigmoid loss, with label smoothing) and SimPO (no reference).

A preference batch holds pairs as consecutive rows, ``[chosen_0, rejected_0, chosen_1, rejected_1, ...]``
(``trainer/data/preference.py``), so any split of the rows into an even number per micro-batch keeps each pair
together. Its targets are the rows' next tokens (``IGNORE_INDEX`` outside the completion) plus one more column: the
reference model's log-probability of the row's completion, a float64 stored bit for bit in the int64 column
(``reference_column``), so it travels with the targets through every engine (dp slices, accumulation chunks,
pipeline micro-batches) without another argument.

Per pair, with ``logp`` the policy's summed log-probability of a completion's tokens and ``ref`` the reference's:

- ``dpo``: ``delta = (logp_c - ref_c) - (logp_r - ref_r)``, loss ``-(1 - eps) logsigmoid(beta delta) - eps
  logsigmoid(-beta delta)`` (Rafailov et al. 2023; ``eps`` = label smoothing, the conservative DPO of Mitchell
  2023), rewards ``beta (logp - ref)``;
- ``simpo``: ``delta = avg_c - avg_r - gamma / beta`` with ``avg`` the log-probability per completion token, the
  same loss, rewards ``beta avg`` (Meng et al. 2024): no reference at all.

``PreferenceLoss`` is the loss the engines call (``reduction="sum"``: the pairs' losses summed; ``count`` tells
``TokenMean`` to divide by the global number of pairs), and it keeps the step's sums of the pair statistics
(``STATS``) for the loop's metrics. In ``collect`` mode it records each row's log-probability instead (the
reference pass: the column then holds the row's index).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from models.losses import IGNORE_INDEX
from models.objectives import OBJECTIVES, PreferenceObjective

__all__ = ["OBJECTIVES", "PreferenceLoss", "PreferenceObjective", "mean_stats", "reference_column"]

#: the per-pair statistics kept per step, summed (the loop divides by ``pairs``)
STATS = (
    "pairs",
    "rewards_chosen",
    "rewards_rejected",
    "rewards_margin",
    "rewards_accuracy",
    "logps_chosen",
    "logps_rejected",
    "ref_logps_chosen",
    "ref_logps_rejected",
)


def reference_column(values: torch.Tensor) -> torch.Tensor:
    """float64 values as the int64 column that carries them in the targets (the same bits)."""
    return values.to(torch.float64).contiguous().view(torch.int64)


def split_targets(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token targets, the extra column as raw int64) of a preference batch's targets."""
    return targets[..., :-1], targets[..., -1].contiguous()


def sequence_logps(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's target tokens (float64), their count); vocabulary-sharded logits
    (``tp.loss_parallel``) are reduced by torch's ``loss_parallel`` and come back whole."""
    flat = logits.reshape(-1, logits.size(-1)).float()
    nll = F.cross_entropy(flat, tokens.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none")
    if isinstance(nll, DTensor):
        nll = nll.full_tensor()
    rows = tokens.shape[0]  # summed in float64: a reward is a small difference of two such sums
    return -nll.view(rows, -1).double().sum(-1), (tokens != IGNORE_INDEX).sum(-1)


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward all-reduces the gradient too: every rank's loss reads the summed value, so each
    rank's share gets the sum of the ranks' gradients (their losses are parts of one mean, ``TokenMean``)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class PreferenceLoss:
    """The engines' loss on preference batches (``reduction="sum"``: the sum of the pairs' losses).

    With each sequence split over ranks (context parallel: ``sequence_group``), a row's log-probability and its count
    of completion tokens are summed over that group before the pairs are compared; every rank of it then holds the
    same pairs (counted once per rank by ``count``, so the global mean divides by that group's size as well)."""

    #: columns after the tokens in the targets that are per row, not per token (the reference's): kept whole when a
    #: dimension splits the sequence (``Engine.local_batch``)
    extra_columns = 1

    def __init__(self, objective: PreferenceObjective, *, sequence_group=None):
        self.objective = objective
        self.sequence_group = sequence_group
        self.collect = False
        """Reference pass: record (row index, log-probability) per row, train nothing."""
        self.collected: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._sums: torch.Tensor | None = None

    @staticmethod
    def count(targets: torch.Tensor) -> torch.Tensor:
        """The pairs in ``targets`` (what the loss is a mean over)."""
        return torch.tensor(targets.shape[0] // 2, dtype=torch.int64, device=targets.device)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "sum") -> torch.Tensor:
        tokens, column = split_targets(targets)
        logps, lengths = sequence_logps(logits, tokens)
        if self.sequence_group is not None:  # each rank scored its chunk of every row: the rows' sums
            logps = _SumOverRanks.apply(logps, self.sequence_group)
            dist.all_reduce(lengths, group=self.sequence_group)
        if self.collect:
            if not _placeholder_call():
                self.collected.append((column.detach().cpu(), logps.detach().double().cpu()))
            return logps.sum() * 0.0
        losses, stats = self.pair_losses(logps, lengths, column.view(torch.float64))
        if not _placeholder_call():
            self._add(stats)
        return losses.sum() if reduction == "sum" else losses.mean()

    def pair_losses(
        self, logps: torch.Tensor, lengths: torch.Tensor, ref: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(each pair's loss, the ``STATS`` sums over these pairs) from the rows' log-probabilities."""
        o = self.objective
        ref = ref.to(logps.dtype) if o.needs_reference else torch.zeros_like(logps)
        chosen, rejected = logps[0::2], logps[1::2]
        ref_c, ref_r = ref[0::2], ref[1::2]
        if o.name == "simpo":
            score = logps / lengths.clamp(min=1).to(logps.dtype)
            reward_c, reward_r = o.beta * score[0::2], o.beta * score[1::2]
            delta = score[0::2] - score[1::2] - o.gamma / o.beta
        else:
            reward_c, reward_r = o.beta * (chosen - ref_c), o.beta * (rejected - ref_r)
            delta = (chosen - ref_c) - (rejected - ref_r)
        eps = o.label_smoothing
        losses = -(1 - eps) * F.logsigmoid(o.beta * delta) - eps * F.logsigmoid(-o.beta * delta)
        with torch.no_grad():
            rc, rr = reward_c.detach(), reward_r.detach()
            parts = (rc, rr, rc - rr, (rc > rr).to(rc.dtype), chosen, rejected, ref_c, ref_r)
            stats = torch.stack([torch.tensor(float(len(losses)), device=logps.device)] + [p.sum() for p in parts])
        return losses, stats.double()

    def _add(self, stats: torch.Tensor) -> None:
        self._sums = stats if self._sums is None else self._sums + stats

    def take(self, device: torch.device) -> torch.Tensor:
        """The ``STATS`` sums since the last ``take`` (zeros where this rank computed no loss), and reset."""
        sums = self._sums if self._sums is not None else torch.zeros(len(STATS), dtype=torch.float64)
        self._sums = None
        return sums.to(device)


#: torch's pipeline stage runs the loss once on placeholder outputs (uninitialised tensors) to learn the gradients'
#: shapes, in this function, when a schedule first runs or switches between training and evaluation
_METADATA_INFERENCE = "_backward_metadata_inference"


def _placeholder_call(depth: int = 8) -> bool:
    """Whether the loss is being called by torch's pipeline metadata inference (its statistics are not a batch's)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == _METADATA_INFERENCE:
            return True
        frame = frame.f_back
    return False


def mean_stats(sums: torch.Tensor, *, prefix: str = "") -> dict[str, float]:
    """The per-pair means of summed ``STATS`` (summed over ranks: equal copies, as tensor-parallel ranks hold, weigh
    every pair alike), named ``<prefix><stat>``; empty when no pair was seen."""
    values = sums.tolist()
    pairs = values[0]
    if pairs <= 0:
        return {}
    return {f"{prefix}{name}": v / pairs for name, v in zip(STATS[1:], values[1:])}
