"""``python train.py model.init_from=DIR`` alone: the family and every size come from DIR's config.json (typed as
that family's schema, saved in the run's .hydra/config.yaml), GPT-2's dropout is carried over, the command line's
other ``model.*`` overrides still apply, an explicit ``model=`` still wins (and a mismatch is still refused), and
a base dropout the run does not keep is named in a warning. In process; the run it makes, through train.py:
tests/integration/test_hf_init_from_and_export.py."""

from __future__ import annotations

import pytest

from tests.hf_helpers import hf_model, save_folder
from trainer.hf.start import InitFromError, adopt, chose_model, default_model_choice
from trainer.validate import validate


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    qwen3 = hf_model("qwen3", vocab_size=256, num_key_value_heads=2, head_dim=32)
    gpt2 = hf_model("gpt", vocab_size=256, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return {"qwen3": save_folder(qwen3, base / "tiny-qwen3"), "gpt": save_folder(gpt2, base / "tiny-gpt2")}


def test_adopted_model_is_typed_and_keeps_command_line_overrides(compose_cfg, folders):
    cfg = compose_cfg(
        "parallel=single", f"model.init_from={folders['gpt']}", "model.init_device=cpu", "data.seq_len=32"
    )
    notes = adopt(cfg, overrides=[f"model.init_from={folders['gpt']}", "model.init_device=cpu"])
    assert cfg.model.family == "gpt" and cfg.model.dropout == 0.1 and cfg.model.max_seq_len == 64
    assert cfg.model.init_device == "cpu" and "dropout=0.1" in notes[0]
    with pytest.raises(Exception, match="n_layers"):
        cfg.model.n_layers = "four"  # the gpt schema's int
    validate(cfg)  # the adopted model matches its folder
    cfg = compose_cfg("parallel=single", f"model.init_from={folders['qwen3']}", "model.dropout=0.2")
    with pytest.raises(InitFromError, match="model.dropout: the qwen3 model config.json describes"):
        adopt(cfg, overrides=["model.dropout=0.2"])


def test_an_explicit_model_wins(folders, compose_cfg):
    default = default_model_choice()
    assert default == "gpt_small"
    assert not chose_model([f"model.init_from={folders['qwen3']}"], default)
    assert chose_model(["model=qwen3_debug", "model.init_from=x"], "qwen3_debug")
    assert chose_model([], "llama_debug")  # an experiment's override of /model
    cfg = compose_cfg("parallel=single", "model=gpt2_debug", f"model.init_from={folders['gpt']}")
    with pytest.raises(Exception, match="model.n_layers: this run 4, config.json 2"):
        validate(cfg)


def test_a_base_dropout_the_run_drops_is_named(compose_cfg, folders):
    sizes = ("model.n_layers=2", "model.d_model=64", "model.d_ff=96", "model.max_seq_len=64", "data.seq_len=64")
    cfg = compose_cfg("parallel=single", "model=gpt2_debug", f"model.init_from={folders['gpt']}", *sizes)
    warnings = validate(cfg).warnings
    assert any("config.json has dropout 0.1 and this run model.dropout=0.0" in w for w in warnings), warnings
    cfg.model.dropout = 0.1
    assert not any("dropout" in w for w in validate(cfg).warnings)
