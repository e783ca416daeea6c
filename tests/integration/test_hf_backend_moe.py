"""Mixtures of experts through the Hugging Face backend (``models/hf_transformers``), one multirun: a tiny DeepSeek-V3
(MLA attention, a dense first layer, a shared expert, grouped routing; ``model.backend=transformers``, as a native
deepseek_v3 family exists) and a tiny gpt-oss (attention sinks, sliding and full layers, experts with biases),
written by transformers. transformers' experts run behind meshtrain's dispatch seam
(``models/hf_transformers/experts.py``), so dp2 x ep2 splits them by all-to-all (``parallel/techniques/ep.py``): it
and dp2 x pp2 (1F1B) reproduce single's losses and gradient norms to 1e-6 relative, step 1's loss is transformers'
on the same batch, and the ep run exports (per-expert keys for DeepSeek-V3) to a folder transformers loads with
meshtrain's logits (fp32 and bf16)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import FAST, assert_losses_close, case_multirun
from tests.hf_helpers import max_logit_difference, save_architecture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "dp_ep": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "ep": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 1},
    },
    "dp_pp": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 2, "schedule": "1f1b", "micro_batches": 2},
    },
}
MODELS = ("deepseek_v3", "gpt_oss")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("arch")
    return {name: save_architecture(name, base / name) for name in MODELS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folders):
    cases = {
        f"{name}_{layout}": {**LAYOUTS[layout], "model": {"init_from": str(folders[name]), "backend": "transformers"}}
        for name in MODELS
        for layout in LAYOUTS
    }
    steps = ("trainer.max_steps=3", "pp.trace_step=0")
    return case_multirun(cases, *FAST, *steps, base=tmp_path_factory.mktemp("runs"), group="hf_moe", timeout=800)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", MODELS)
def test_step_one_loss_is_transformers_loss(runs, folders, name):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    job = runs[f"{name}_single"]
    cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
    assert cfg.model.family == "hf"
    inputs, targets = instantiate(cfg.data, seed=int(cfg.trainer.seed)).global_batch(1)
    hf = AutoModelForCausalLM.from_pretrained(folders[name]).eval()
    with torch.no_grad():
        want = hf(inputs, labels=targets, shift_labels=targets).loss.item()
    got = metrics(job)[0]["loss"]
    print(f"{name}: step 1 loss {got:.7f}, transformers {want:.7f}")
    assert abs(got - want) <= 1e-6 * want


@pytest.mark.parametrize("case", [f"{n}_{layout}" for n in MODELS for layout in ("dp_ep", "dp_pp")])
def test_layouts_match_single(runs, case):
    name = case.rsplit("_", 2)[0]
    ref, got = metrics(runs[f"{name}_single"]), metrics(runs[case])
    assert len(got) == 3
    for key in ("loss", "grad_norm"):
        worst = max(abs(a[key] - r[key]) / r[key] for a, r in zip(got, ref))
        print(f"{case}: max relative {key} difference {worst:.1e}")
        assert_losses_close([m[key] for m in got], [m[key] for m in ref], rel=1e-6)
    if case.endswith("dp_ep"):  # the experts were split: tokens went to them by all-to-all
        assert all(m["ep_a2a_time_s"] > 0 and m["ep_a2a_calls"] > 0 for m in got)


@pytest.mark.parametrize("name", MODELS)
def test_ep_run_exports_with_transformers_logits(runs, tmp_path, name):
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from models.spec import builder_kwargs
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    job = runs[f"{name}_dp_ep"]
    checkpoint = find_checkpoint(job)
    module = instantiate(builder_kwargs(read_marker(checkpoint)["model"])).eval()
    module.load_state_dict(full_state(checkpoint))
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for dtype, cast in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        out = export(job, tmp_path / dtype, dtype=dtype)
        hf = AutoModelForCausalLM.from_pretrained(out, dtype=cast).eval()
        with torch.no_grad():
            module.to(cast)  # in the export's dtype, its buffers (rotary tables ...) as transformers keeps them
            buffers = dict(hf.named_buffers())
            for key, buffer in module.named_buffers():
                buffer.data = buffers[key if key in buffers else f"model.{key}"].clone()
            diff = max_logit_difference(module(tokens), hf(tokens).logits)
        print(f"{name}: exported after 3 steps under dp2 x ep2 ({dtype}), max |logit difference| {diff:.2e}")
        assert diff <= 1e-5
