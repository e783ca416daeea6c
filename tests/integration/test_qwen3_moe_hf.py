"""A tiny Qwen3-MoE written by transformers (random weights, per-expert keys, no download) starts runs with
``model.init_from`` under single, fsdp (each rank reads only its experts' slices), 1f1b on 2 stages and
``parallel=hybrid`` dp2 x ep2 x pp2 (4 ranks, ep borrowing dp: each stage's experts split over ep): step 1's loss is
transformers' LM loss on the same batch, the layouts reproduce single's losses (1e-6 relative). fsdp (one forward of
4 per rank) runs the whole batch's balance (``model.balance_scope=global``) as single running all 8 in one forward;
1f1b (4 micro-batches of 2 on one data-parallel rank) and the hybrid (2 micro-batches of 2 per rank, under
``model.balance_scope=micro_batch``: one forward's sequences) as single running forwards of 2), and the fsdp and
hybrid runs' checkpoints export
(``trainer.export``, through the family's adapter) to folders whose logits in transformers equal meshtrain's."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import FAST, assert_losses_close, case_multirun
from tests.hf_helpers import hf_model, max_logit_difference, save_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HF = {"vocab_size": 256, "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 1000000.0}
SIZES = {
    "vocab_size": 256,
    "n_layers": 2,
    "d_model": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 32,
    "d_ff": 96,
    "moe_d_ff": 32,
    "n_experts": 8,
    "top_k": 2,
    "mlp_only_layers": [],
    "norm_eps": 1e-5,
}
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "1f1b": {"defaults": [{"override /parallel": "pp"}], "pp": {"schedule": "1f1b", "micro_batches": 4}},
    "single_mb2": {"defaults": [{"override /parallel": "single"}], "data": {"micro_batch_size": 2}},
    # the example: python train.py model=qwen3_moe_debug parallel=hybrid dp.size=2 ep.size=2 pp.size=2
    "ep_pp": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "ep": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 2, "schedule": "1f1b", "micro_batches": 2},
    },
}
REFERENCE = {"ep_pp": "single_mb2", "1f1b": "single_mb2"}  # forwards of 2 samples, as their micro-batches
MICRO = {"ep_pp", "single_mb2"}  # model.balance_scope=micro_batch: the balance of one forward's sequences


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_folder(hf_model("qwen3_moe", **HF), tmp_path_factory.mktemp("hf") / "qwen3_moe")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folder):
    cases = {
        name: {
            **layout,
            "defaults": [*layout["defaults"], {"override /model": "qwen3_moe_debug"}],
            "model": {**SIZES, "init_from": str(folder), **({"balance_scope": "micro_batch"} if name in MICRO else {})},
        }
        for name, layout in LAYOUTS.items()
    }
    steps = ("trainer.max_steps=3", "pp.trace_step=0")
    return case_multirun(cases, *FAST, *steps, base=tmp_path_factory.mktemp("runs"), group="hf_case", timeout=800)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_step_one_loss_is_transformers_loss(runs, folder):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    cfg = OmegaConf.load(runs["single"] / ".hydra" / "config.yaml")
    inputs, targets = instantiate(cfg.data, seed=int(cfg.trainer.seed)).global_batch(1)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = hf(inputs).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    got = metrics(runs["single"])[0]["loss"]
    print(f"step 1 loss {got:.6f}, transformers {want:.6f}")
    assert abs(got - want) <= 1e-5 * want


@pytest.mark.parametrize("case", ["fsdp", "1f1b", "ep_pp"])
def test_layouts_match_single(runs, case):
    ref, got = metrics(runs[REFERENCE.get(case, "single")]), metrics(runs[case])
    assert len(got) == 3
    losses = [m["loss"] for m in got]
    print(case, "max relative loss difference", max(abs(a - r["loss"]) / r["loss"] for a, r in zip(losses, ref)))
    assert_losses_close(losses, [m["loss"] for m in ref], rel=1e-6)
    assert_losses_close([m["grad_norm"] for m in got], [m["grad_norm"] for m in ref], rel=1e-6)
    assert_losses_close([m["moe_aux_loss"] for m in got], [m["moe_aux_loss"] for m in ref], rel=1e-6)
    if case == "ep_pp":  # the experts were split: tokens went to them by all-to-all
        assert all(m["ep_a2a_time_s"] > 0 and m["ep_a2a_calls"] > 0 for m in got)


@pytest.mark.parametrize("case", ["fsdp", "ep_pp"])
def test_run_exports_with_transformers_logits(runs, tmp_path, case):
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from models.spec import builder_kwargs
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    out = export(runs[case], tmp_path / "hf")
    checkpoint = find_checkpoint(runs[case])
    module = instantiate(builder_kwargs(read_marker(checkpoint)["model"])).eval()
    module.load_state_dict(full_state(checkpoint))
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), hf(tokens).logits)
    print(f"{case}: exported after 3 steps, max |logit difference| in transformers {diff:.2e}")
    assert diff <= 1e-5
