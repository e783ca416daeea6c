"""model.init_device in one process: auto's rule, the cpu path's weights unchanged, the meta path's
build -> place (to_empty + init_weights) giving a working model (tests/integration/test_meta_init_fsdp.py
runs it sharded)."""

from __future__ import annotations

import logging

import pytest
import torch

from models.spec import resolve_init_device


def test_auto_picks_meta_only_when_the_weights_do_not_fit():
    assert resolve_init_device("auto", full_fp32_bytes=2e9, budget_bytes=1e9) == "meta"
    assert resolve_init_device("auto", full_fp32_bytes=1e8, budget_bytes=1e9) == "cpu"
    assert resolve_init_device("auto", full_fp32_bytes=None, budget_bytes=1.0) == "cpu"  # no formula: as before
    assert resolve_init_device("meta", full_fp32_bytes=1.0, budget_bytes=1e9) == "meta"


def _ctx(cfg, tmp_path):
    from parallel.assembly.context import WorkerContext
    from trainer.typed.run_spec import run_spec
    from trainer.validate import build_layout

    return WorkerContext(
        run=run_spec(cfg, build_layout(cfg)),
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        mesh=None,
        run_dir=tmp_path,
        log=logging.getLogger("test"),
    )


@pytest.mark.parametrize("model", ["gpt_small", "llama_debug"])
def test_cpu_path_gives_the_seeded_weights_and_meta_path_a_working_model(compose_cfg, tmp_path, model):
    from hydra.utils import instantiate

    from models.spec import builder_kwargs

    cfg = compose_cfg(f"model={model}", "model.init_device=cpu")
    ctx = _ctx(cfg, tmp_path)
    built = ctx.build_model()
    torch.manual_seed(cfg.trainer.seed)
    reference = instantiate(builder_kwargs(cfg.model))
    for (name, a), (_, b) in zip(built.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name
    assert ctx.model_init["init_device"] == "cpu"

    cfg = compose_cfg(f"model={model}", "model.init_device=meta")
    ctx = _ctx(cfg, tmp_path)
    meta = ctx.build_model(materialize=False)
    assert all(p.is_meta for p in meta.parameters())
    placed = ctx.place(meta)
    assert not any(t.is_meta for t in [*placed.parameters(), *placed.buffers()])
    x = torch.randint(0, 256, (2, 16))
    out = placed(x)
    assert out.shape == built(x).shape and torch.isfinite(out).all()
    for (name, a), (_, b) in zip(placed.state_dict().items(), built.state_dict().items()):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert abs(float(a.float().std()) - float(b.float().std())) < 0.01, name  # same init distribution
