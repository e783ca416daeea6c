"""Multi-token prediction (MTP; DeepSeek-V3, arXiv 2412.19437 section 2.2): ``D`` modules after the main model, on
its last pipeline stage, module ``k`` predicting the token ``k + 1`` places ahead.

Module ``k`` at position ``i``: ``h'_i = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])``, ``h^k = block(h')`` (a
block of the main model's kind), logits ``head(norm(h^k))`` predicting ``t_{i+k+1}``. ``h^0`` is the main model's
final hidden state after its norm (vLLM's ``deepseek_mtp.py`` takes the same); ``Emb`` and ``head`` are the main
model's: the embedding is held again under ``mtp.embed`` (one Parameter, tied: a pipeline's last stage keeps its
copy equal to the first stage's, ``parallel/pipeline/tied.py``), the head is called where it is.

The tokens come from the targets (``targets[:, i]`` is ``t_{i+1}``), so the last stage needs nothing but what the
loss already gets: depth ``k`` embeds ``targets`` shifted left by ``k - 1`` and predicts ``targets`` shifted by
``k``; a position whose embedded token or label is masked (``IGNORE_INDEX``, or past the sequence's end) adds
nothing.

**The loss** (``mtp_token_cross_entropy``, the family's ``ModelSpec.loss``): the main next-token cross-entropy plus
``weight / D x sum_k`` of depth ``k``'s summed cross-entropy, both over the engines' one divisor (the step's count of
main targets, ``parallel/foundation/token_loss.py``): the paper's ``L_MTP = lambda / D sum_k L_MTP^k`` with
``L_MTP^k`` normalised by the sequence's length. Its value is the main loss alone (the MTP term enters as ``term -
term.detach()``), so reported losses stay comparable with and without MTP; the term's gradient trains the modules,
the shared embedding and head, and the main model through ``h^0``. The model's forward leaves what the modules need
(``MTP.prepare``) and the loss, called right after that forward by every engine and pipeline schedule, takes it.

``mtp_loss`` (each step's metric): ``1 / D sum_k`` depth ``k``'s summed cross-entropy over the step's main target
count, summed over the data-parallel ranks (and gathered from the last stage over pp): the value the weight
multiplies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from models.losses import IGNORE_INDEX, count_targets, token_cross_entropy

#: the MTP module that prepared the latest training forward on this process (the loss takes it)
_PENDING: list[MTP] = []


class MTPLayer(nn.Module):
    """One depth: ``enorm``, ``hnorm``, ``eh_proj``, the ``block`` and the head's ``norm`` (HF: ``shared_head.norm``)."""

    def __init__(self, d_model: int, *, eps: float, block: nn.Module):
        super().__init__()
        self.enorm = nn.RMSNorm(d_model, eps=eps)
        self.hnorm = nn.RMSNorm(d_model, eps=eps)
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.norm = nn.RMSNorm(d_model, eps=eps)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, *context, **kwargs) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.block(x, *context, **kwargs)


class MTP(nn.Module):
    """The ``D`` modules (``layers``, keyed by their index in the Hugging Face layout: the main model's layer count
    plus ``k - 1``) and the embedding they share with the main model."""

    def __init__(self, *, vocab_size: int, d_model: int, eps: float, blocks: dict[int, nn.Module], loss_weight: float):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleDict({str(i): MTPLayer(d_model, eps=eps, block=b) for i, b in blocks.items()})
        self.loss_weight = float(loss_weight)
        self.pending: tuple | None = None
        self.step_sums: torch.Tensor | None = None
        """(summed MTP term, main targets) of the training forwards since ``mtp_step_sums`` last took them."""

    def prepare(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], *context, **kwargs) -> None:
        """Called by the model's forward on the last stage: keep what the loss needs (training forwards only)."""
        if not (self.training and torch.is_grad_enabled()):
            return
        self.pending = (hidden, head, context, kwargs)
        _PENDING[:] = [self]

    def term(self, targets: torch.Tensor) -> torch.Tensor:
        """``1 / D sum_k`` depth ``k``'s cross-entropy summed over its predictions (fp32), from the prepared forward."""
        hidden, head, context, kwargs = self.pending
        self.pending = None
        total = torch.zeros((), device=targets.device)
        for k, layer in enumerate(self.layers.values(), start=1):
            tokens, labels = depth_tokens(targets, k)
            hidden = layer(hidden, self.embed(tokens), *context, **kwargs)
            total = total + token_cross_entropy(head(layer.norm(hidden)), labels, reduction="sum")
        return total / len(self.layers)

    def record(self, term: torch.Tensor, targets: torch.Tensor) -> None:
        row = torch.stack([term.detach().double(), count_targets(targets).double()])
        self.step_sums = row if self.step_sums is None else self.step_sums + row


def depth_tokens(targets: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``k``'s embedded tokens (``t_{i+k}``: ``targets`` shifted left by ``k - 1``, a masked one as id 0) and
    labels (``t_{i+k+1}``: shifted by ``k``; masked past the end and where the embedded token is masked)."""
    tokens = _shifted(targets, k - 1)
    labels = _shifted(targets, k).masked_fill(tokens == IGNORE_INDEX, IGNORE_INDEX)
    return tokens.clamp(min=0), labels


def _shifted(targets: torch.Tensor, by: int) -> torch.Tensor:
    """``targets[:, by:]`` padded on the right with ``IGNORE_INDEX`` to the same length."""
    if by == 0:
        return targets
    pad = targets.new_full((*targets.shape[:-1], by), IGNORE_INDEX)
    return torch.cat([targets[..., by:], pad], dim=-1)


def take_pending() -> MTP | None:
    """The MTP module whose forward awaits its loss (None: the model has none, or this is not a training forward)."""
    if not _PENDING or _PENDING[0].pending is None:
        return None
    return _PENDING.pop()


def mtp_token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """``token_cross_entropy`` plus, after a training forward of a model with MTP, the weighted MTP term with the
    value of zero (its gradient only)."""
    mtp = take_pending()
    if mtp is None:
        return token_cross_entropy(logits, targets, reduction=reduction)
    main = token_cross_entropy(logits, targets, reduction="sum")
    term = mtp.term(targets)
    mtp.record(term, targets)
    total = main + mtp.loss_weight * (term - term.detach())
    return total if reduction == "sum" else total / count_targets(targets).clamp(min=1)


def mtp_modules(parts: Iterable[nn.Module]) -> list[MTP]:
    return [m for part in parts for m in part.modules() if isinstance(m, MTP)]


def mtp_metrics(
    parts: Iterable[nn.Module], *, device: torch.device | str = "cpu", reduce: Callable[[torch.Tensor], None] | None
) -> dict[str, float]:
    """``mtp_loss``: the step's (summed MTP term, main targets) of the MTP modules in ``parts``, taken (they start
    over), summed by ``reduce`` in place (over the data-parallel ranks, and over pp where only the last stage holds
    them: every rank of those groups calls it); empty when no MTP forward ran anywhere."""
    parts = list(parts)
    sums = torch.zeros(2, dtype=torch.float64)
    for m in mtp_modules(parts):
        if m.step_sums is not None:
            sums += m.step_sums.cpu()
        m.step_sums = None
    if reduce is not None:
        sums = sums.to(device)
        reduce(sums)
    term, count = sums.tolist()
    return {"mtp_loss": term / count} if count > 0 else {}


@contextmanager
def mtp_uncounted(module: nn.Module) -> Iterator[None]:
    """Leave the MTP modules' step sums (and their pending forward) as they were: a forward and loss that are not
    training (torch's pipeline shape inference) adds nothing to ``mtp_loss``."""
    held = [(m, m.step_sums, m.pending) for m in mtp_modules([module])]
    try:
        yield
    finally:
        for m, sums, pending in held:
            m.step_sums, m.pending = sums, pending
