"""The mixture-of-experts block (``models/moe.py``): its two expert paths agree, no token is dropped unless a capacity
is set (then the drops are counted), the load-balancing loss trains the router without entering the LM loss and
follows the engine's loss scale, DeepSeek-V3's bias moves toward balance, and the planner's sizes for the published
Qwen3-MoE configs are the published ones."""

from __future__ import annotations

import pytest
import torch

from models.moe import MoE, expert_counts, load_balancing_loss, moe_metrics, set_aux_loss_scale, update_expert_bias


def block(**kw):
    torch.manual_seed(0)
    return MoE(16, 32, n_experts=4, top_k=2, **kw)


def reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """transformers' loop: every token through its k experts one by one, weighted."""
    flat = x.reshape(-1, x.shape[-1])
    _, idx, weights = moe.router(flat)
    e = moe.experts
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(idx.shape[1]):
            k = int(idx[t, j])
            h = torch.nn.functional.silu(e.w1[k] @ flat[t]) * (e.w3[k] @ flat[t])
            out[t] += weights[t, j] * (e.w2[k] @ h)
    return out.reshape(x.shape)


def test_the_dispatch_computes_every_tokens_top_k_experts():
    moe, x = block(), torch.randn(2, 5, 16)
    with torch.no_grad():
        assert torch.allclose(moe(x), reference(moe, x), atol=1e-6)
    assert moe_metrics(moe)["moe_dropped_tokens"] == 0


def test_bf16_autocast_sums_the_weighed_rows_in_fp32():
    """Under bf16 autocast (trainer.precision=bf16-mixed without FSDP2) the experts' rows are bf16 and the routing
    weights fp32 (the block input's dtype): the combine sums in fp32 and trains (it refused to index_add fp32 rows
    into a bf16 output before), within bf16 rounding of the fp32 block."""
    moe, x = block(), torch.randn(2, 5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = moe(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad is not None and moe.experts.w1.grad is not None
    with torch.no_grad():
        assert (y - moe(x)).abs().max().item() <= 2e-2 * moe(x).abs().max().item()


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_grouped_mm_gives_the_loops_numbers():
    """torch 2.13 runs ``_grouped_mm``'s forward on CPU (no backward there: the loop is the CPU default)."""
    loop, x = block(expert_impl="loop"), torch.randn(3, 7, 16)
    grouped = block(expert_impl="grouped_mm")
    with torch.no_grad():
        a, b = loop(x), grouped(x)
    assert (a - b).abs().max().item() <= 1e-6


def test_capacity_drops_and_counts_the_overflow():
    moe, x = block(capacity_factor=0.5), torch.randn(4, 8, 16)
    with torch.no_grad():
        y = moe(x)
    limit = moe.dispatcher.capacity(32, 2)  # ceil(0.5 x 32 x 2 / 4) = 8 rows per expert
    counts = moe.last_stats["tokens_per_expert"]
    assert limit == 8
    assert int(moe.last_stats["dropped"]) == int((counts - counts.clamp(max=limit)).sum()) > 0
    assert not torch.allclose(y, reference(moe, x), atol=1e-6)  # dropped choices add nothing


def test_load_balancing_loss_is_one_when_balanced_and_e_when_collapsed():
    probs = torch.full((8, 4), 0.25)
    idx = torch.arange(8).remainder(4).reshape(4, 2)
    assert load_balancing_loss(probs, idx).item() == pytest.approx(2.0)  # k = 2: E x sum (k/E)(1/E) = k
    collapsed = torch.zeros(8, 4)
    collapsed[:, 0] = 1.0
    assert load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long)).item() == pytest.approx(4.0)


def test_load_balancing_loss_of_sequence_slices_averages_to_the_whole():
    """Context parallel: each cp rank holds a slice of one forward's tokens; with the whole forward's counts (f)
    and its own probabilities (P), the slices' losses average to the whole's and their gradients (averaged over
    the ranks as FSDP2 averages them over dp x cp) equal the whole's."""
    torch.manual_seed(0)
    logits = torch.randn(16, 8, requires_grad=True)
    probs = logits.softmax(-1)
    idx = probs.topk(2, dim=-1).indices
    whole = load_balancing_loss(probs, idx)
    (want,) = torch.autograd.grad(whole, logits, retain_graph=True)
    counts = expert_counts(idx, 8)
    parts = [load_balancing_loss(p, i, counts=counts, tokens=16) for p, i in zip(probs.split(8), idx.split(8))]
    assert torch.stack(parts).mean().item() == pytest.approx(whole.item(), rel=1e-6)
    (got,) = torch.autograd.grad(torch.stack(parts).mean(), logits)
    torch.testing.assert_close(got, want)
    alone = torch.stack([load_balancing_loss(p, i) for p, i in zip(probs.split(8), idx.split(8))]).mean()
    assert abs(alone.item() - whole.item()) > 1e-3  # each slice's own counts: not the whole forward's loss


def test_aux_loss_gradient_joins_backward_with_the_engines_scale():
    """The output is unchanged; the router's gradient gains coef x scale x d(aux)/d(router), nothing else does."""
    x = torch.randn(2, 6, 16)
    plain, aux = block(), block(aux_loss_coef=0.5)
    set_aux_loss_scale(aux, 0.25)
    for m in (plain, aux):
        m.train()
        m(x).sum().backward()
    assert torch.equal(plain.experts.w1.grad, aux.experts.w1.grad)
    probs, idx, _ = aux.router(x.reshape(-1, 16))
    expected = torch.autograd.grad(0.125 * load_balancing_loss(probs, idx), aux.router.weight)[0]
    assert torch.allclose(aux.router.weight.grad - plain.router.weight.grad, expected, atol=1e-7)
    assert moe_metrics(aux)["moe_aux_loss"] == pytest.approx(load_balancing_loss(probs, idx).item())


def test_bias_balancing_moves_toward_the_underloaded_experts():
    moe = block(bias_update_rate=0.01)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0  # every token prefers expert 0 when its input is positive
    moe.train()
    with torch.no_grad():
        moe(torch.rand(2, 8, 16))
    counts = moe.tokens_per_expert.clone()
    update_expert_bias(moe)
    bias = moe.router.expert_bias
    assert bias[counts.argmax()] < 0 and bias[counts.argmin()] > 0 and moe.tokens_per_expert is None


@pytest.mark.parametrize(
    "name, total, active", [("qwen3_30b_a3b", 30.53e9, 3.35e9), ("qwen3_235b_a22b", 235.09e9, 22.19e9)]
)
def test_published_sizes(compose_cfg, name, total, active):
    """Qwen3 technical report (arXiv 2505.09388, Table 2): 30.5B total / 3.3B active, 235B / 22B."""
    from models.registry import model_shape

    shape = model_shape(compose_cfg(f"model={name}").model)
    assert shape.params == pytest.approx(total, rel=1e-3)
    assert shape.active_params == pytest.approx(active, rel=1e-3)
    dense_flops = 6 * shape.params
    assert shape.training_flops_per_token(4096) < dense_flops / 4  # FLOPs follow the active parameters


def test_a_forward_inside_uncounted_leaves_the_counters():
    """torch's pipeline shape inference runs a real forward at the first step: it must not count as training."""
    from models.moe import moe_step_table, uncounted

    moe, x = block(bias_update_rate=0.01), torch.randn(2, 5, 16)
    moe.train()
    moe(x)
    before = (moe.step_stats.clone(), moe.tokens_per_expert.clone())
    with uncounted(moe):
        moe(torch.randn(3, 5, 16))
    assert torch.equal(moe.step_stats, before[0]) and torch.equal(moe.tokens_per_expert, before[1])
    layers, table = moe_step_table(moe)
    assert table[0, 1] == 1 and table[0, 3:].sum() == 2 * 5 * moe.top_k  # one forward of 10 tokens, top-k each


def test_activation_checkpointing_recompute_counts_nothing_twice():
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    from models.moe import moe_step_table

    moe, x = block(bias_update_rate=0.01), torch.randn(2, 5, 16, requires_grad=True)
    moe.train()
    with set_checkpoint_early_stop(False):  # the recompute runs the whole forward again (no stop at its last save)
        checkpoint(moe, x, use_reentrant=False).sum().backward()
    _, table = moe_step_table(moe)
    assert table[0, 1] == 1 and table[0, 3:].sum() == 2 * 5 * moe.top_k
    assert int(moe.tokens_per_expert.sum()) == 2 * 5 * moe.top_k


def test_the_balance_sums_its_counts_over_the_ranks_only_when_the_loss_trains(monkeypatch):
    """``balance_scope=global``: with ``router_aux_loss_coef`` > 0 each forward sums the expert counts over the data
    ranks (one all-reduce per layer); at 0 the loss is only reported, over this rank's tokens, with no collective."""
    summed = []
    monkeypatch.setattr("models.moe._summed", lambda counts, group: summed.append(group) or counts)
    monkeypatch.setattr("models.moe.dist.get_world_size", lambda group: 2)
    x = torch.randn(2, 5, 16)
    for coef, sums in ((0.0, 0), (0.01, 1)):
        moe = block(aux_loss_coef=coef)
        moe.balance_group = "data ranks"
        moe(x)
        assert len(summed) == sums
