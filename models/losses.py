"""The losses a model family trains with, named by its ``ModelSpec.loss`` (``"models.losses:NAME"``).

Every engine (one module, accumulated chunks, pipeline stages, evaluation) calls the configured family's
loss, ``ctx.model_spec.loss_fn()``: the strategy decides how the model runs, the family what it is trained
to predict. A loss takes the model's output, the targets and ``reduction`` (``"mean"`` over the predictions, or
their ``"sum"``, which the engines divide by the global batch's count of targets, ``count_targets``:
``parallel/foundation/token_loss.py``), computed in float32 whatever the model's precision (bf16 logits are upcast
first). A target equal to ``IGNORE_INDEX`` (a prompt token of a chat, padding) is no prediction: it adds nothing
to the loss and is not counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: the target id that is no prediction (torch's and Hugging Face's ``-100``): masked out of loss and count
IGNORE_INDEX = -100


def count_targets(targets: torch.Tensor) -> torch.Tensor:
    """How many predictions ``targets`` asks for: its entries other than ``IGNORE_INDEX`` (an int64 scalar)."""
    return (targets != IGNORE_INDEX).sum()


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: ``(batch, seq, vocab)`` logits against ``(batch, seq)`` token ids, ``IGNORE_INDEX``
    targets left out.

    Logits of any leading shape are flattened to ``(-1, vocab)``; a vocabulary-sharded DTensor (tensor
    parallel with ``tp.loss_parallel``) keeps its shards, under torch's ``loss_parallel()`` (which takes
    ``reduction="sum"`` on any mesh)."""
    flat = logits.reshape(-1, logits.size(-1)).float()
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction)


def class_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Classification cross-entropy: ``(batch, classes)`` logits against ``(batch,)`` labels."""
    if logits.dim() != 2 or targets.dim() != 1:
        raise ValueError(
            f"class_cross_entropy takes (batch, classes) logits and (batch,) labels, got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}; a sequence model declares models.losses:token_cross_entropy as its ModelSpec.loss"
        )
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction=reduction)
