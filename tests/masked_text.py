"""A test dataset (``data._target_=tests.masked_text.MaskedText`` on ``data=text``): the byte corpus with a
different number of masked targets in every sample, so ranks and micro-batches hold unequal counts of targets.

Sample i of a batch keeps only its last ``seq_len * (i + 1) // (batch + 1)`` targets (the first sample nearly all
masked, the last nearly none), as a chat's prompt tokens are masked; the training loss of any layout must still
be the token mean over the global batch (tests/integration/test_token_weighted_parity.py)."""

from __future__ import annotations

from models.losses import IGNORE_INDEX
from trainer.data.datasets import TextCorpus


def mask_targets(targets):
    """``targets`` with a growing share of each row's leading positions set to ``IGNORE_INDEX``."""
    rows, seq = targets.shape
    out = targets.clone()
    for i in range(rows):
        out[i, : seq - seq * (i + 1) // (rows + 1)] = IGNORE_INDEX
    return out


class MaskedText(TextCorpus):
    def global_batch(self, step: int):
        inputs, targets = super().global_batch(step)
        return inputs, mask_targets(targets)

    def val_batch(self, index: int):
        inputs, targets = super().val_batch(index)
        return inputs, mask_targets(targets)
