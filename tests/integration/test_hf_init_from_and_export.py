"""Hugging Face in and out through train.py: a tiny tied Llama and a tiny Qwen3 written by transformers (random
weights, no download) start runs with ``model.init_from`` under single, pp 2, and two 4-rank hybrids (Llama: dp 2 x
pp 2, so FSDP2 inside pipeline stages and the tied embedding's copy on the last stage read from the embedding; Qwen3:
tp 2 x pp 2 with sequence parallel, so its q/k head norms under the TP plan), and Qwen3 under context parallel
(cp 2: the sequence split, FSDP2 over the cp ranks).

One multirun starts every job. Step 1's loss equals the loss transformers computes on the same batch (the weights
were read, not drawn); every layout reproduces single's losses and gradient norms (1e-4 relative); the hybrid
runs' checkpoints export (``python -m trainer.export``) to folders whose logits in transformers equal meshtrain's
to 1e-5. In-process checks (adapters, refusals, sharded reads, export of each family) are in tests/system/test_hf_*.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import FAST, assert_losses_close, case_multirun, run_train
from tests.hf_helpers import hf_model, max_logit_difference, save_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = ("trainer.max_steps=3", "pp.trace_step=0", "pp.micro_batches=2")
#: the tiny checkpoints: 2 blocks (one per pipeline stage), 4 query heads sharing 2 key/value heads
TINY_HF = {"vocab_size": 256, "num_hidden_layers": 2, "num_key_value_heads": 2}
FAMILIES = {
    "llama": (  # tied, as Llama 3.2 1B: the pipelined runs keep a copy of the embedding on the last stage
        "llama_debug",
        {"tie_word_embeddings": True},
        {"n_layers": 2, "d_model": 64, "d_ff": 96, "n_kv_heads": 2, "norm_eps": 1e-5, "tie_embeddings": True},
    ),
    "qwen3": (
        "qwen3_debug",
        {"head_dim": 32, "rope_theta": 1000000.0},
        {"n_layers": 2, "d_model": 64, "d_ff": 96, "n_kv_heads": 2, "head_dim": 32, "norm_eps": 1e-5},
    ),
}
HYBRID = {"defaults": [{"override /parallel": "hybrid"}]}
CASES = {
    "llama_single": ("llama", {"defaults": [{"override /parallel": "single"}]}),
    "llama_pp2": ("llama", {"defaults": [{"override /parallel": "pp"}]}),
    "llama_hybrid_dp2_pp2": ("llama", {**HYBRID, "dp": {"size": 2}, "tp": {"size": 1}, "pp": {"size": 2}}),
    "qwen3_single": ("qwen3", {"defaults": [{"override /parallel": "single"}]}),
    "qwen3_hybrid_tp2_pp2_sp": (
        "qwen3",
        {**HYBRID, "dp": {"size": 1}, "tp": {"size": 2, "sequence_parallel": True}, "pp": {"size": 2}},
    ),
    "qwen3_hybrid_cp2": (
        "qwen3",
        {**HYBRID, "dp": {"size": 1}, "tp": {"size": 1}, "pp": {"size": 1}, "cp": {"size": 2}},
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_models")
    return {
        family: save_folder(hf_model(family, **TINY_HF, **FAMILIES[family][1]), base / family) for family in FAMILIES
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folders):
    """case -> run folder, from one multirun."""
    cases = {}
    for name, (family, layout) in CASES.items():
        model_name, _, sizes = FAMILIES[family]
        cases[name] = {
            **layout,
            "defaults": [*layout["defaults"], {"override /model": model_name}],
            "model": {**sizes, "init_from": str(folders[family])},
        }
    return case_multirun(cases, *FAST, *STEPS, base=tmp_path_factory.mktemp("hf_runs"), group="hf_case", timeout=800)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["llama_single", "qwen3_single"])
def test_step_one_loss_is_transformers_loss_on_the_same_batch(runs, folders, case):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    cfg = OmegaConf.load(runs[case] / ".hydra" / "config.yaml")
    inputs, targets = instantiate(cfg.data, seed=int(cfg.trainer.seed)).global_batch(1)
    hf = AutoModelForCausalLM.from_pretrained(folders[CASES[case][0]]).eval()
    with torch.no_grad():
        logits = hf(inputs).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    got = metrics(runs[case])[0]["loss"]
    print(f"{case}: step 1 loss {got:.6f}, transformers {want:.6f}")
    assert abs(got - want) <= 1e-5 * want


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("single")])
def test_fine_tune_under_every_layout_matches_single(runs, case):
    family = CASES[case][0]
    ref, got = metrics(runs[f"{family}_single"]), metrics(runs[case])
    assert len(got) == 3
    assert_losses_close([m["loss"] for m in got], [m["loss"] for m in ref], rel=1e-4)
    assert_losses_close([m["grad_norm"] for m in got], [m["grad_norm"] for m in ref], rel=1e-4)
    summary = json.loads((runs[case] / "summary.json").read_text())
    init = summary["model_init"]
    assert init["init_device"] == "meta"
    # each rank read only what it holds: a pipeline rank holds a stage, so less than the whole model
    assert all(0 < r["bytes_read"] < init["full_fp32_bytes"] for r in init["hf_load_per_rank"]), init


@pytest.mark.parametrize("case", ["llama_hybrid_dp2_pp2", "qwen3_hybrid_tp2_pp2_sp", "qwen3_hybrid_cp2"])
def test_hybrid_run_exports_to_transformers_with_equal_logits(runs, tmp_path, case):
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


def test_lm_eval_runs_on_an_export_with_no_extra_arguments(compose_cfg, tmp_path):
    """lm-evaluation-harness's command on an exported folder, `--model hf --model_args pretrained=OUT`, nothing
    else about the model: a local multiple-choice task (json data files, --include_path; no download) reports
    its accuracy. The export is written in-process; lm_eval runs the model in a process of its own (here, not in
    the fast tier: it took a tenth of tests/unit's time)."""
    from tests.hf_helpers import run_lm_eval
    from tests.system.test_hf_export import write_run
    from trainer.export import main

    write_run(compose_cfg, tmp_path / "run", "model=gpt_small")
    out = tmp_path / "hf"
    assert main([str(tmp_path / "run"), "--hf", str(out)]) == 0
    done = run_lm_eval(out, tmp_path / "tasks")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "meshtrain_tiny_mc" in done.stdout and "acc" in done.stdout


def test_a_run_from_a_folder_alone_takes_its_model(tmp_path):
    """``python train.py model.init_from=DIR`` alone trains the folder's model (what decides it, in process:
    tests/system/test_hf_init_from_alone.py)."""
    from omegaconf import OmegaConf

    folder = save_folder(hf_model("qwen3", vocab_size=256, num_key_value_heads=2, head_dim=32), tmp_path / "tiny-qwen3")
    run = run_train(
        f"model.init_from={folder}", "parallel=single", "trainer.max_steps=1", *FAST, run_dir=tmp_path / "r"
    )
    assert "the qwen3 model its config.json describes (vocab_size=256, n_layers=2, d_model=64" in run.output
    saved = OmegaConf.load(tmp_path / "r" / ".hydra" / "config.yaml").model
    assert (saved.family, saved.n_layers, saved.d_model, saved.n_kv_heads, saved.head_dim) == ("qwen3", 2, 64, 2, 32)
    assert saved.name == "tiny-qwen3" and OmegaConf.to_container(saved)["max_seq_len"] == "${data.seq_len}"
    assert "weights read from" in run.output
