"""The loss is the mean over the global batch's target tokens (``parallel/foundation/token_loss.py``), in one process:
accumulated micro-batches holding different numbers of targets give the full batch's token mean and its
gradients, not a mean of per-micro-batch means. The ranks' side is tests/integration/test_token_weighted_parity.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.losses import IGNORE_INDEX, count_targets, token_cross_entropy
from parallel.assembly.module_engine import ModuleEngine
from parallel.foundation.token_loss import TokenMean

VOCAB = 13


def _lm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """4 sequences of 6: the first micro-batch (of 2) holds 2 targets, the second 11."""
    torch.manual_seed(1)
    x = torch.randint(0, VOCAB, (4, 6))
    y = torch.randint(0, VOCAB, (4, 6))
    y[0, 1:] = IGNORE_INDEX
    y[1, :5] = IGNORE_INDEX
    y[2, 0] = IGNORE_INDEX
    return x, y


def test_accumulated_micro_batches_give_the_full_batch_token_mean_and_its_gradients():
    x, y = _batch()
    reference = _lm()
    want = F.cross_entropy(reference(x).reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE_INDEX)
    want.backward()
    # the old weighting (mean of the two micro-batches' means) is another number: the test can tell them apart
    halves = [token_cross_entropy(reference(a).detach(), b) for a, b in zip(x.chunk(2), y.chunk(2))]
    assert abs(float(sum(halves) / 2) - float(want)) > 1e-2

    model = copy.deepcopy(reference)
    model.zero_grad(set_to_none=True)
    engine = ModuleEngine(model, accumulation=2, loss_fn=token_cross_entropy)
    got = engine.train_step(x, y)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    assert float(engine.eval_step(x, y)) == pytest.approx(float(want), rel=1e-6)


def test_no_target_in_the_batch_gives_zero_loss_and_no_gradient():
    x, y = _batch()
    y[:] = IGNORE_INDEX
    loss = TokenMean(token_cross_entropy)
    assert int(loss.start(y)) == 0
    model = _lm()
    value = loss(model(x), y)
    value.backward()
    assert float(value) == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())


def test_the_count_leaves_out_ignored_targets_and_the_sum_reduction_adds_the_rest():
    x, y = _batch()
    assert int(count_targets(y)) == 4 * 6 - 5 - 5 - 1
    logits = _lm()(x)
    total = token_cross_entropy(logits, y, reduction="sum")
    assert float(total / count_targets(y)) == pytest.approx(float(token_cross_entropy(logits, y)), rel=1e-6)


def test_token_mean_refuses_a_term_before_the_step_is_counted():
    with pytest.raises(RuntimeError, match=r"before start\(targets\)"):
        TokenMean(token_cross_entropy)(torch.zeros(1, 2, VOCAB), torch.zeros(1, 2, dtype=torch.long))


class _TwoRankMesh:
    """A loss mesh of two ranks with no process group behind it: an all-reduce over it would fail."""

    def size(self) -> int:
        return 2

    def get_group(self) -> object:
        return object()


def test_a_count_of_the_global_batch_given_by_the_loop_takes_no_all_reduce():
    x, y = _batch()
    logits = _lm()(x)
    alone = TokenMean(token_cross_entropy)  # one rank holding the whole batch counts it
    assert int(alone.start(y)) == int(count_targets(y))
    want = float(alone(logits, y))
    # two ranks, each holding half the rows: the global batch's count, as the all-reduce of theirs would sum it
    loss = TokenMean(token_cross_entropy, loss_mesh=_TwoRankMesh())
    for rows in y.chunk(2):
        assert int(loss.start(rows, global_count=int(count_targets(y)))) == int(count_targets(y))
    terms = [loss(a, b) for a, b in zip(logits.chunk(2), y.chunk(2))]  # divisor: the count over the mesh's size
    assert float(sum(terms) / 2) == pytest.approx(want, rel=1e-6)
