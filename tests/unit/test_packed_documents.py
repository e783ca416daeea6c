"""Packing without cross-talk (models/documents.py): documents packed into one sequence, each attending only within
itself with positions restarting, give the same loss and gradients as the same documents each in a row of its own,
for every decoder family (GPT's learned positions, Llama's and Qwen3's rotary angles)."""

from __future__ import annotations

import copy

import pytest
import torch

from models.documents import document_mask
from models.losses import IGNORE_INDEX, token_cross_entropy

SEQ, VOCAB, PAD = 24, 40, 0
DOCS = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21, 22, 23, 24, 25]]


def _model(family: str):
    from models.gpt.model import GPT
    from models.llama.model import Llama
    from models.qwen3.model import Qwen3

    torch.manual_seed(0)
    sizes = {"vocab_size": VOCAB, "n_layers": 2, "d_model": 32, "n_heads": 4, "max_seq_len": SEQ}
    if family == "gpt":
        return GPT(**sizes)
    cls = Llama if family == "llama" else Qwen3
    return cls(**sizes, n_kv_heads=2, d_ff=48)


def _rows(docs, *, packed: bool):
    """(inputs, targets): every document's next-token pairs, one per row padded with PAD (targets masked), or all
    in one row with positions restarting at each document ((1, 2, SEQ) inputs)."""
    groups = [docs] if packed else [[d] for d in docs]
    inputs, targets, positions = [], [], []
    for group in groups:
        x = [t for d in group for t in d[:-1]]
        y = [t for d in group for t in d[1:]]
        p = [i for d in group for i in range(len(d) - 1)]
        pad = SEQ - len(x)
        inputs.append(x + [PAD] * pad)
        targets.append(y + [IGNORE_INDEX] * pad)
        positions.append(p + list(range(pad)))
    x, y = torch.tensor(inputs), torch.tensor(targets)
    return (torch.stack([x, torch.tensor(positions)], dim=1) if packed else x), y


def _loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = token_cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["gpt", "llama", "qwen3"])
def test_packed_documents_give_the_unpacked_loss_and_gradients(family):
    model = _model(family)
    packed_x, packed_y = _rows(DOCS, packed=True)
    alone_x, alone_y = _rows(DOCS, packed=False)
    assert packed_x.shape == (1, 2, SEQ) and alone_x.shape == (3, SEQ)
    packed_loss, packed_grads = _loss_and_grads(model, packed_x, packed_y)
    alone_loss, alone_grads = _loss_and_grads(copy.deepcopy(model), alone_x, alone_y)
    print(f"{family}: packed {packed_loss:.7f}, each document alone {alone_loss:.7f}")
    assert packed_loss == pytest.approx(alone_loss, rel=1e-6)
    assert packed_grads.keys() == alone_grads.keys()
    for name, g in packed_grads.items():
        torch.testing.assert_close(g, alone_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # the same row read as one plain sequence (documents see each other, positions run on): another loss
    crosstalk, _ = _loss_and_grads(model, packed_x[:, 0], packed_y)
    assert abs(crosstalk - alone_loss) > 1e-4


def test_the_document_mask_is_causal_inside_each_document_only():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    mask = document_mask(positions)[0, 0].int()
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ]
    )
    assert torch.equal(mask, want)


def test_token_windows_restart_positions_after_each_eos_and_mask_its_target():
    """data=tokens with data.packing=documents: a window crossing documents (each ended by EOS = 1)."""
    import numpy as np

    from trainer.data.packing import window_documents

    window = np.array([[7, 8, 1, 9, 10, 11, 1, 12, 13]])
    inputs, targets = window_documents(window[:, :-1], window[:, 1:], eos_id=1)
    assert inputs.shape == (1, 2, 8)
    assert inputs[0, 0].tolist() == [7, 8, 1, 9, 10, 11, 1, 12]
    assert inputs[0, 1].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert targets[0].tolist() == [8, 1, IGNORE_INDEX, 10, 11, 1, IGNORE_INDEX, 13]
