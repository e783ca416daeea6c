"""DeepSeek-V3 (``models/deepseek_v3``) from a tiny checkpoint written by transformers (random weights, its routing
bias random too, no download), started with ``model.init_from=DIR`` alone (the family and sizes from its
config.json), under single and under the layouts below, one multirun. The sequence-wise balance loss is per sequence
and the bias balancing's load the step's over every data-parallel rank, so no layout changes what trains: every case
matches single running the whole batch of 8 in one forward, losses, the balance loss and gradient norms within 1e-6
relative over 3 steps:

- ``parallel=hybrid dp.size=2 ep.size=2 pp.size=2`` (1f1b, 2 micro-batches of 2 per rank; the issue's done-when),
  whose checkpoint exports to a folder whose logits in transformers equal meshtrain's;
- cp2 x ep2 (each rank half of every sequence: the per-sequence counts summed over cp);
- dp2 x ep2 with full activation checkpointing (the all-to-alls run again in backward);
- tp 2 with sequence parallel (MLA's heads split: ``wq_b``, ``wkv_b`` column-wise, ``wo`` row-wise, the down-
  projections replicated, the shared rotary key's gradient summed over tp; sparse layers whole on each tp rank);
- pp with the interleaved 1F1B schedule (4 stages on 2 ranks, 4 micro-batches).

Multi-token prediction (``models/mtp.py``): the hybrid, the checkpointed dp2 x ep2 and the interleaved runs start
from a copy of the folder holding one MTP layer (``model.layers.4``, as vLLM reads it; ``tests/hf_helpers.py``
``add_mtp_layers``), which turns MTP on (depth 1, weight 0.3), and match single started from that copy
(``single_mtp``): the MTP module on the last stage, its embedding tied to the first stage's; ``mtp_loss`` too.
cp and tp refuse MTP, so those two start from the folder without it. Step 1's loss is transformers' LM loss on the
same batch, with MTP or without (the reported loss is the main one)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.helpers import FAST, assert_losses_close, case_multirun, no_checkpoint
from tests.hf_helpers import add_mtp_layers, hf_model, max_logit_difference, save_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOL = 1e-6
HYBRID = {"defaults": [{"override /parallel": "hybrid"}], "tp": {"size": 1}}
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "ep_pp": {**HYBRID, "dp": {"size": 2}, "ep": {"size": 2}, "pp": {"size": 2, "micro_batches": 2}},
    "ep_cp": {**HYBRID, "dp": {"size": 1}, "cp": {"size": 2}, "ep": {"size": 2}, "pp": {"size": 1}},
    "ep_ac": {
        **HYBRID,
        "dp": {"size": 2},
        "ep": {"size": 2},
        "pp": {"size": 1},
        "trainer": {"activation_checkpointing": "full"},
    },
    "tp_sp": {"defaults": [{"override /parallel": "tp"}], "tp": {"size": 2, "sequence_parallel": True}},
    "interleaved": {
        "defaults": [{"override /parallel": "pp"}],
        "pp": {"schedule": "interleaved_1f1b", "stages_per_rank": 2, "micro_batches": 4},
    },
}

MTP = ("single_mtp", "ep_pp", "ep_ac", "interleaved")  # started from the folder with an MTP layer


def reference(case: str) -> str:
    return "single_mtp" if case in MTP else "single"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_folder(
        hf_model("deepseek_v3", num_hidden_layers=4, vocab_size=256, max_position_embeddings=32),
        tmp_path_factory.mktemp("hf") / "deepseek_v3",
    )


@pytest.fixture(scope="module")
def mtp_folder(tmp_path_factory, folder):
    return add_mtp_layers(folder, tmp_path_factory.mktemp("hf") / "deepseek_v3_mtp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folder, mtp_folder):
    cases = {
        case: {
            **LAYOUTS.get(case, LAYOUTS["single"]),
            "model": {"init_from": str(mtp_folder if case in MTP else folder)},
        }
        for case in (*LAYOUTS, "single_mtp")
    }
    # the hybrid run's step-3 checkpoint is exported; the others' metrics are compared, with no checkpoint
    cases = {case: c if case == "ep_pp" else no_checkpoint(c) for case, c in cases.items()}
    common = (*FAST, "trainer.max_steps=3", "pp.trace_step=0")
    return case_multirun(cases, *common, base=tmp_path_factory.mktemp("runs"), group="ds_case", timeout=800)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_folder_alone_picks_this_family(runs):
    summary = json.loads((runs["ep_pp"] / "summary.json").read_text())
    config = (runs["ep_pp"] / ".hydra" / "config.yaml").read_text()
    assert "family: deepseek_v3" in config and summary["steps"] == 3


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
    print(f"step 1 loss {got:.7f}, transformers {want:.7f}")
    assert abs(got - want) <= 1e-6 * want
    plain, mtp = metrics(runs["single"]), metrics(runs["single_mtp"])
    assert abs(mtp[0]["loss"] - want) <= 1e-6 * want and mtp[1]["loss"] != plain[1]["loss"]  # MTP trained
    assert all(m["mtp_loss"] > 0 for m in mtp) and all("mtp_loss" not in m for m in plain)


@pytest.mark.parametrize("case", [c for c in LAYOUTS if c != "single"])
def test_layouts_match_single(runs, case):
    ref, got = metrics(runs[reference(case)]), metrics(runs[case])
    assert len(got) == len(ref) == 3
    for key in ("loss", "moe_aux_loss", "grad_norm", *(("mtp_loss",) if case in MTP else ())):
        a, b = [m[key] for m in got], [m[key] for m in ref]
        print(case, f"max relative {key} difference", max(abs(x - y) / abs(y) for x, y in zip(a, b)))
        assert_losses_close(a, b, rel=TOL)
    assert [m["moe_tokens_per_expert"] for m in got] == [m["moe_tokens_per_expert"] for m in ref]
    if case.startswith("ep"):  # the experts were split: tokens went to them by all-to-all
        assert all(m["ep_a2a_time_s"] > 0 and m["ep_a2a_calls"] > 0 for m in got)


def test_the_hybrid_run_exports_with_transformers_logits(runs, tmp_path):
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from models.spec import builder_kwargs
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    out = export(runs["ep_pp"], tmp_path / "hf")  # with its MTP layer (model.layers.4), which transformers leaves out
    checkpoint = find_checkpoint(runs["ep_pp"])
    module = instantiate(builder_kwargs(read_marker(checkpoint)["model"])).eval()
    module.load_state_dict(full_state(checkpoint))
    assert module.layers["1"].feed_forward.router.expert_bias.abs().max() > 0  # the bias moved, and is exported
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine, theirs = module(tokens), hf(tokens).logits
    diff = max_logit_difference(mine, theirs)
    print(
        f"exported after 3 steps: max |logit difference| in transformers {diff:.2e} (max |logit| {theirs.abs().max():.2f})"
    )
    assert diff <= 1e-5 * theirs.abs().max().item()
    from safetensors.torch import load_file

    written = {k: v for f in out.glob("*.safetensors") for k, v in load_file(f).items()}
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert torch.equal(written["model.layers.4.eh_proj.weight"], module.mtp.layers["4"].eh_proj.weight.detach())
    assert torch.equal(written["model.layers.4.embed_tokens.weight"], written["model.embed_tokens.weight"])
    assert {re.sub(r"^model\.layers\.4\.", "", k) for k in written if k.startswith("model.layers.4.")} >= {
        "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
        "self_attn.q_a_proj.weight", "mlp.gate.weight", "mlp.experts.0.gate_proj.weight", "input_layernorm.weight",
    }  # fmt: skip
