"""The losses a model family trains with, named by its ``ModelSpec.loss`` (``"models.losses:NAME"``).

Every engine (one module, accumulated chunks, pipeline stages, evaluation) calls the configured family's
loss, ``ctx.model_spec.loss_fn()``: the strategy decides how the model runs, the family what it is trained
to predict. A loss takes the model's output and the targets and returns their mean over every prediction,
computed in float32 whatever the model's precision (bf16 logits are upcast first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: ``(batch, seq, vocab)`` logits against ``(batch, seq)`` token ids.

    Logits of any leading shape are flattened to ``(-1, vocab)``; a vocabulary-sharded DTensor (tensor
    parallel with ``tp.loss_parallel``) keeps its shards, under torch's ``loss_parallel()``."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def class_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean classification cross-entropy: ``(batch, classes)`` logits against ``(batch,)`` labels."""
    if logits.dim() != 2 or targets.dim() != 1:
        raise ValueError(
            f"class_cross_entropy takes (batch, classes) logits and (batch,) labels, got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}; a sequence model declares models.losses:token_cross_entropy as its ModelSpec.loss"
        )
    return F.cross_entropy(logits.float(), targets)
