"""The planner sums a pipeline rank's blocks by kind (``ModelShape.layer_groups``): the sums must equal the
block-by-block ones on a model whose blocks differ in width and sparsity, for every split the planner makes."""

from __future__ import annotations

from models.shape import ModelShape
from parallel.plan.cost_model import ActivationCase, rank_layers, rank_params, saved_layer_activation_bytes

MIXED = ModelShape(
    name="mixed",
    n_layers=7,
    d_model=64,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=256,
    max_seq_len=128,
    layer_d_ff=(96, 96, 64, 96, 64, 64, 96),
    gated_mlp=True,
    norm_params=1,
    learned_positions=False,
    n_experts=8,
    top_k=2,
    moe_d_ff=32,
    sparse=(False, True, False, True, True, False, False),
)


def test_groups_count_every_block_once_by_kind():
    groups = MIXED.layer_groups(range(7))
    assert sum(n for _, n in groups) == 7
    kinds = {(MIXED.layer_d_ff[i], MIXED.sparse[i]) for i, _ in groups}
    assert len(kinds) == len(groups) == len({(MIXED.layer_d_ff[i], MIXED.sparse[i]) for i in range(7)})
    assert MIXED.layer_groups([5, 6]) == MIXED.layer_groups((5, 6))  # lists and tuples alike


def test_grouped_sums_equal_the_block_by_block_sums():
    case = ActivationCase(seq_len=32, micro_batch=2, tp=2, sequence_parallel=True, recompute="none", element_bytes=2)
    for pp in (1, 2, 3, 7):
        for layers in rank_layers(7, pp=pp, stages_per_rank=1, schedule="1f1b" if pp > 1 else "none"):
            grouped = sum(n * saved_layer_activation_bytes(MIXED, i, case) for i, n in MIXED.layer_groups(layers))
            assert grouped == sum(saved_layer_activation_bytes(MIXED, i, case) for i in layers)
            params = rank_params(MIXED, layers, first=0 in layers, last=6 in layers, tp=2, meshtrain=True)
            whole = sum(MIXED.layer_norm_params(i) + MIXED.layer_moe_params(i) for i in layers)
            split = sum(MIXED.layer_params(i) for i in layers) - whole
            head = MIXED.head_params if 6 in layers else 0
            emb = MIXED.embedding_params if 0 in layers else 0
            head_norm = MIXED.norm_params * MIXED.d_model if 6 in layers else 0
            assert params == (split + head - head_norm) / 2 + whole + emb + head_norm


def test_a_shape_that_remembered_answers_pickles_and_answers_the_same():
    """The calibration's spawned processes receive the shape by pickle: what it remembered (per_block answers,
    the cost model's per-block terms) is left behind and recomputed there, to the same values."""
    import pickle

    shape = ModelShape(**{f: getattr(MIXED, f) for f in ("name", "n_layers", "d_model", "n_heads", "vocab_size",
                                                          "max_seq_len", "layer_d_ff", "sparse", "n_experts",
                                                          "top_k", "moe_d_ff", "gated_mlp")})  # fmt: skip
    asked = [shape.layer_params(i) for i in range(7)] + [shape.remember(("a term", 3), lambda: 3.5)]
    copy = pickle.loads(pickle.dumps(shape))
    assert copy == shape and copy.block_kinds(range(7)) == shape.block_kinds(range(7))
    assert [copy.layer_params(i) for i in range(7)] + [copy.remember(("a term", 3), lambda: 3.5)] == asked
