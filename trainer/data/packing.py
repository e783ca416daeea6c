"""Rows of a batch built from whole documents: one per row (padded), or several packed into a row
(``data.packing=documents``), each document's positions restarting at 0 (numpy only: no torch).

A document of L tokens gives L - 1 (input, target) pairs; a row holds ``seq_len`` pairs. Padding is input
``pad_id`` with target ``IGNORE_INDEX``; in a packed row it is a document of its own (positions 0, 1, ...), so it
never shares attention with a real one. A packed batch's inputs carry the positions as a second row
(``models/documents.py``: ``(batch, 2, seq)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: the target id that is no prediction (``models.losses.IGNORE_INDEX``; data code imports no torch)
IGNORE_INDEX = -100
PACKINGS = ("none", "documents")


def fill_rows(pairs: Sequence[int], order: Sequence[int], *, seq_len: int, packing: str) -> list[list[int]]:
    """Documents (by index, in ``order``) grouped into rows: one each, or, packed, as many consecutive ones as fit
    in ``seq_len`` pairs (``pairs[d]``: document d's pair count, never more than ``seq_len``)."""
    if packing == "none":
        return [[int(d)] for d in order]
    rows: list[list[int]] = []
    used = seq_len + 1
    for d in order:
        n = int(pairs[d])
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(int(d))
        used += n
    return rows


def assemble(
    rows: Sequence[Sequence[int]],
    document: Callable[[int], tuple[np.ndarray, np.ndarray]],
    *,
    seq_len: int,
    pad_id: int,
    packed: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) int64 arrays for ``rows``: inputs ``(rows, seq_len)``, or ``(rows, 2, seq_len)`` with the
    positions when ``packed``. ``document(d)`` gives document d's tokens and whether each token is a target."""
    inputs = np.full((len(rows), seq_len), pad_id, dtype=np.int64)
    targets = np.full((len(rows), seq_len), IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros((len(rows), seq_len), dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for d in row:
            tokens, is_target = document(d)
            n = len(tokens) - 1
            inputs[r, at : at + n] = tokens[:-1]
            targets[r, at : at + n] = np.where(is_target[1:], tokens[1:], IGNORE_INDEX)
            positions[r, at : at + n] = np.arange(n)
            at += n
        positions[r, at:] = np.arange(seq_len - at)  # the padding: a document of its own
    if packed:
        return np.stack([inputs, positions], axis=1), targets
    return inputs, targets


def window_documents(inputs: np.ndarray, targets: np.ndarray, *, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows of a token stream whose documents end with ``eos_id``, packed: a new document starts after
    each EOS (positions restart), and the EOS's own target (the next document's first token) is masked.
    Returns ``(rows, 2, seq_len)`` inputs and the targets."""
    ends = inputs == eos_id
    starts = np.zeros_like(ends)
    starts[:, 0] = True
    starts[:, 1:] = ends[:, :-1]
    index = np.arange(inputs.shape[1])[None, :].repeat(len(inputs), axis=0)
    last_start = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    targets = np.where(ends, IGNORE_INDEX, targets)
    return np.stack([inputs, index - last_start], axis=1), targets
