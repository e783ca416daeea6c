"""Tied embeddings under tp and pp, the parts that compose in one process: validation accepts them, the TP plan
splits the embedding as its head and keeps one Parameter (fake process group), a V schedule's two local stages share
one Parameter, the embedding groups pair each pp line's first and last stage, the gradient norm counts a copy once,
and a copy's optimizer state is saved under the embedding's name. The trained runs (parity with single, the copies
equal, export, resume) are in tests/integration/test_tied_embeddings_parity.py."""

from __future__ import annotations

import pytest
import torch

from parallel.foundation.grad_clip import clip_grad_norm_
from parallel.pipeline.tied import (
    TiedCopies,
    embedding_group_ranks,
    restored_optimizer_state,
    saved_optimizer_state,
    share_across_stages,
    tied_copies,
)
from trainer.validate import validate

TINY = dict(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)


def tied_llama(**kw):
    from models.llama.model import Llama

    return Llama(**{**TINY, **kw}, tie_embeddings=True)


@pytest.mark.parametrize(
    "layout",
    [
        ("parallel=tp",),
        ("parallel=pp",),
        ("parallel=pp", "pp.schedule=zbv", "pp.stages_per_rank=2"),
        ("parallel=hybrid", "dp.size=2", "tp.size=2", "pp.size=2", "topology.nproc_per_node=8"),
    ],
)
def test_tied_models_are_accepted_under_tp_and_pp(compose_cfg, layout):
    validate(compose_cfg("model=llama_debug", "model.tie_embeddings=true", *layout))


def test_published_tied_sizes_are_accepted_under_tp(compose_cfg):
    for name in ("llama3_2_1b", "qwen3_0_6b", "gpt2"):
        cfg = compose_cfg(f"model={name}", "parallel=tp", "trainer.dry_run=true")
        assert cfg.model.tie_embeddings
        validate(cfg)


@pytest.fixture
def fake_tp_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("loss_parallel", [False, True])
def test_tp_splits_a_tied_embedding_as_its_head_and_keeps_one_parameter(fake_tp_mesh, loss_parallel):
    from torch.distributed.tensor import DTensor, Shard

    from models.llama.spec import SPEC

    parallelize_llama = SPEC.parallelize_fn()  # the decoders' parallelize_decoder over Llama's plan

    model = tied_llama()
    full = model.tok_embeddings.weight.detach().clone()
    parallelize_llama(model, tp_mesh=fake_tp_mesh, sequence_parallel=loss_parallel, loss_parallel=loss_parallel)
    weight = model.tok_embeddings.weight
    assert model.output.weight is weight and isinstance(weight, DTensor)
    assert weight.placements == (Shard(0),) and weight.to_local().shape == (32, 32)
    assert torch.equal(weight.to_local(), full[:32])  # rank 0's vocabulary rows, the values it was built with
    names = [n for n, _ in model.named_parameters()]
    assert "tok_embeddings.weight" in names and "output.weight" not in names  # one Parameter, counted once


def test_tp_splits_the_embedding_of_a_first_stage_alike_and_leaves_an_untied_one_whole(fake_tp_mesh):
    from torch.distributed.tensor import DTensor, Shard

    from models.llama.model import Llama
    from models.llama.spec import SPEC

    parallelize_llama = SPEC.parallelize_fn()  # the decoders' parallelize_decoder over Llama's plan

    stage = tied_llama()
    stage.output, stage.norm = None, None  # the first stage: the embedding without its head
    parallelize_llama(stage, tp_mesh=fake_tp_mesh)
    assert stage.tok_embeddings.weight.placements == (Shard(0),)
    untied = parallelize_llama(Llama(**TINY), tp_mesh=fake_tp_mesh)
    assert not isinstance(untied.tok_embeddings.weight, DTensor)  # as before: replicated plain tensor


def stages(model, *, first_and_last_here: bool):
    """The first and the last of three stages of ``model`` as one rank holds them (a V schedule: both)."""
    from parallel.pipeline.stages import StageSpec, build_stage_module

    specs = [StageSpec(index=0, pp_rank=0, start=0, stop=1, first=True, last=False)]
    specs.append(StageSpec(index=2, pp_rank=0 if first_and_last_here else 1, start=1, stop=2, first=False, last=True))
    return [build_stage_module(model, spec=s) for s in specs]


def test_a_v_schedules_first_and_last_stage_share_one_parameter():
    from parallel.foundation.ties import tied_parameters

    model = tied_llama()
    ties = tied_parameters(model)
    assert ties == [("output.weight", "tok_embeddings.weight")]
    first, last = stages(model, first_and_last_here=True)
    assert last.output.weight is not first.tok_embeddings.weight  # deep copies: apart until shared
    share_across_stages([first, last], ties)
    assert last.output.weight is first.tok_embeddings.weight
    copies = tied_copies([first, last], alias="output.weight", original="tok_embeddings.weight", group=None)
    assert list(copies.params) == ["tok_embeddings.weight"] and not copies.active and copies.uncounted == []


def test_two_local_copies_take_the_originals_values_and_the_summed_gradient():
    """FSDP2 wraps each stage on its own, so a V schedule under dp > 1 keeps two local copies, kept equal."""
    first, last = stages(tied_llama(), first_and_last_here=True)
    with torch.no_grad():
        last.output.weight.add_(1.0)  # a meta build draws the copy apart
    copies = tied_copies([first, last], alias="output.weight", original="tok_embeddings.weight", group=None)
    assert copies.active and copies.aliases == {"output.weight": "tok_embeddings.weight"}
    copies.sync_values()
    assert torch.equal(last.output.weight, first.tok_embeddings.weight)
    first.tok_embeddings.weight.grad = torch.full_like(first.tok_embeddings.weight, 2.0)
    last.output.weight.grad = torch.full_like(last.output.weight, 3.0)
    copies.sync_grads()
    assert torch.equal(first.tok_embeddings.weight.grad, torch.full_like(first.tok_embeddings.weight, 5.0))
    assert torch.equal(last.output.weight.grad, first.tok_embeddings.weight.grad)
    assert last.output.weight.grad is not first.tok_embeddings.weight.grad


def test_embedding_groups_pair_the_first_and_last_stage_of_every_pp_line():
    world = torch.arange(16).reshape(4, 2, 2)  # (pp, dp, tp), as init_device_mesh numbers ranks
    assert embedding_group_ranks(world, pp_dim=0, first=0, last=3) == [[0, 12], [1, 13], [2, 14], [3, 15]]
    assert embedding_group_ranks(world.reshape(4, 4), pp_dim=0, first=0, last=3)[0] == [0, 12]


def test_the_norm_counts_a_copy_once_and_clips_it_alike():
    a, b, c = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    a.grad, b.grad, c.grad = torch.tensor([3.0, 0, 0]), torch.tensor([0, 4.0, 0]), torch.tensor([0, 4.0, 0])
    norm = clip_grad_norm_([a, b, c], 1.0, uncounted=[c])  # c: b's copy
    assert norm.item() == pytest.approx(5.0)
    assert torch.allclose(b.grad, c.grad) and b.grad[1].item() == pytest.approx(0.8, rel=1e-5)


def optimizer_state(*fqns: str) -> dict:
    out = {}
    for i, fqn in enumerate(fqns):
        out[f"state.{fqn}.exp_avg"] = torch.full((2,), float(i))
        out[f"state.{fqn}.step"] = torch.tensor(float(i))
        out[f"param_groups.{fqn}.lr"] = 0.1
    return out


def test_a_copys_optimizer_state_is_saved_under_the_original_name():
    aliases = {"output.weight": "tok_embeddings.weight"}
    # the last stage alone: its copy's state written (and read) as the embedding's, as one process writes it
    own = optimizer_state("layers.1.w", "output.weight")
    saved = saved_optimizer_state(own, aliases)
    assert set(saved) == set(optimizer_state("layers.1.w", "tok_embeddings.weight"))
    assert saved["state.tok_embeddings.weight.exp_avg"] is own["state.output.weight.exp_avg"]  # loaded in place
    saved["param_groups.tok_embeddings.weight.lr"] = 0.5  # what a load brings back
    back = restored_optimizer_state(saved, aliases, template=own)
    assert set(back) == set(own) and back["param_groups.output.weight.lr"] == 0.5
    # both ends on one rank (two copies): written once, read back into both, never one shared tensor
    both = optimizer_state("tok_embeddings.weight", "output.weight")
    saved = saved_optimizer_state(both, aliases)
    assert set(saved) == set(optimizer_state("tok_embeddings.weight"))
    back = restored_optimizer_state(saved, aliases, template=both)
    assert torch.equal(back["state.output.weight.exp_avg"], back["state.tok_embeddings.weight.exp_avg"])
    assert back["state.output.weight.exp_avg"] is not back["state.tok_embeddings.weight.exp_avg"]
    # nothing tied: unchanged
    assert saved_optimizer_state(own, {}) == own


def test_copies_without_a_group_on_a_rank_holding_nothing_do_nothing():
    copies = TiedCopies({}, original="tok_embeddings.weight", group=None)
    assert not copies.active
    copies.sync_values()
    copies.sync_grads()
