"""Architectures trained through the Hugging Face backend (``models/hf_transformers``: transformers' own modules)
from their folder alone, one multirun serving every assert: a tiny Mistral (sliding window), a tiny Gemma 3 (sliding
and global layers, tied embeddings, per-head norms), a tiny Phi-3 (fused ``qkv_proj`` and ``gate_up_proj``) and a
tiny OLMo 2 (norms after the projections, q/k norms over the whole projection) from ``model.init_from=DIR``;
mixtures of experts, a tiny DeepSeek-V3 (MLA attention, a dense first layer, a shared expert, grouped routing;
``model.backend=transformers``, as a native deepseek_v3 family exists), a tiny gpt-oss (attention sinks, sliding and
full layers, experts with biases) and a tiny Mixtral (experts held per expert in its files), their experts behind
meshtrain's dispatch seam (``models/hf_transformers/experts.py``). All written by transformers.

Per architecture one single-process run is the reference of every layout: step 1's loss under it is transformers'
loss on the same batch; fsdp (one unit per decoder layer; Mistral), dp2 x tp2 (the config's ``base_model_tp_plan``:
column/row-wise for Mistral and Gemma 3, the gathered column-wise styles of Phi-3's fused projections and OLMo 2's
q/k/v), dp2 x ep2 (the experts split, tokens sent by all-to-all; the MoE ones), dp2 x pp2 (1F1B, stages cut between
decoder layers) and dp2 x cp2 (Ulysses through transformers' ``AttentionInterface``; OLMo 2, full attention: a
window shorter than the sequence is refused under cp), the fsdp run with whole layers recomputed and the pipelined
ones with the selective policy (``trainer.activation_checkpointing``), reproduce its losses and gradient norms to
1e-6 relative over 2 steps; ``model=hf model.config_dir=DIR`` pretrains from config.json alone (the architecture's
``_init_weights``; in bf16-mixed); a hybrid run of each (but Phi-3 and OLMo 2, whose names are Mistral's kind)
exports to a folder transformers loads with meshtrain's logits (fp32 and bf16; DeepSeek-V3's and Mixtral's experts
per expert as their checkpoints hold them). LoRA on the
DeepSeek-V3 (``model.lora.targets=[kv_a_proj_with_mqa,kv_b_proj,o_proj]``, transformers' names: a layer the plan keeps
whole, a column-wise and a row-wise one) under dp2 x tp2 reproduces its own single run (which starts at the base
model's loss) to 1e-6, and its PEFT adapter export, loaded by peft over the folder, gives meshtrain's logits."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers import FAST, assert_losses_close, case_multirun, no_checkpoint
from tests.hf_helpers import max_logit_difference, save_architecture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = 2
HYBRID = {"defaults": [{"override /parallel": "hybrid"}], "dp": {"size": 2}, "tp": {"size": 1}, "pp": {"size": 1}}
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    # activation checkpointing rides on two layouts (recomputation changes no number): whole layers under fsdp, the
    # op-level policy (matmuls kept) under the pipeline
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}], "trainer": {"activation_checkpointing": "full"}},
    "dp_tp": {**HYBRID, "tp": {"size": 2}},
    "dp_ep": {**HYBRID, "ep": {"size": 2}},
    "dp_cp": {**HYBRID, "cp": {"size": 2}},
    "dp_pp": {
        **HYBRID,
        "pp": {"size": 2, "schedule": "1f1b", "micro_batches": 2},
        "trainer": {"activation_checkpointing": "selective"},
    },
}
#: architecture -> the layouts compared with its single run, and the one whose run is exported (None: its names are
#: the checkpoint's less the base model's prefix, as Mistral's, whose export is read back)
MODELS = {
    "mistral": (("fsdp", "dp_tp", "dp_pp"), "dp_tp"),
    "gemma3_text": (("dp_tp", "dp_pp"), "dp_pp"),
    "deepseek_v3": (("dp_ep", "dp_pp"), "dp_ep"),
    "gpt_oss": (("dp_ep", "dp_pp"), "dp_ep"),
    "phi3": (("dp_tp",), None),
    "olmo2": (("dp_tp", "dp_cp"), None),
    "mixtral": (("dp_ep",), "dp_ep"),
}
#: config.json changes of an architecture's folder: the later ones 2 layers deep (all their layouts need)
SMALLER = {name: {"num_hidden_layers": 2} for name in ("phi3", "olmo2", "mixtral")}
#: the architectures a native family reads too: the backend taken by model.backend=transformers
NATIVE = ("deepseek_v3",)
#: LoRA on the backend, trained under dp2 x tp2, by transformers' names: adapters on DeepSeek-V3's latent projection
#: (which the plan keeps whole; its rotary key's gradient summed over tp), kv_b_proj (column-wise) and o_proj (row-wise)
LORA = {"rank": 4, "targets": ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]}
LORA_CASES = {"deepseek_v3_lora_single": "single", "deepseek_v3_lora_dp_tp": "dp_tp"}
COMPARED = [f"{name}_{layout}" for name, (layouts, _) in MODELS.items() for layout in layouts]
#: the runs whose checkpoint is read back (exported); the others end without one (trainer.checkpoint_every=0: their
#: metrics are what is compared, and a checkpoint changes no number)
EXPORTED = {f"{name}_{exported}" for name, (_, exported) in MODELS.items() if exported} | {"deepseek_v3_lora_dp_tp"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("arch")
    out = {name: save_architecture(name, base / name, **SMALLER.get(name, {})) for name in MODELS}
    scratch = base / "scratch"
    scratch.mkdir()
    shutil.copy(out["mistral"] / "config.json", scratch / "config.json")  # config.json alone: no weights
    out["scratch"] = scratch
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folders):
    cases = {}
    for name, (layouts, _) in MODELS.items():
        for layout in ("single", *layouts):
            model = {"init_from": str(folders[name])} | ({"backend": "transformers"} if name in NATIVE else {})
            cases[f"{name}_{layout}"] = {**LAYOUTS[layout], "model": model}
    for case, layout in LORA_CASES.items():
        model = {"init_from": str(folders["deepseek_v3"]), "backend": "transformers", "lora": LORA}
        cases[case] = {**LAYOUTS[layout], "model": model}
    cases["scratch"] = {  # in bf16-mixed: the backend's modules under autocast
        "defaults": [{"override /parallel": "single"}, {"override /model": "hf"}],
        "model": {"config_dir": str(folders["scratch"])},
        "trainer": {"precision": "bf16-mixed"},
    }
    cases = {case: c if case in EXPORTED else no_checkpoint(c) for case, c in cases.items()}
    steps = (f"trainer.max_steps={STEPS}", "pp.trace_step=0")
    return case_multirun(cases, *FAST, *steps, base=tmp_path_factory.mktemp("runs"), group="hf_case", timeout=1100)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(MODELS))
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


@pytest.mark.parametrize("case", COMPARED)
def test_layouts_match_single(runs, case):
    name = next(n for n in MODELS if case.startswith(f"{n}_"))
    ref, got = metrics(runs[f"{name}_single"]), metrics(runs[case])
    assert len(got) == STEPS
    for key in ("loss", "grad_norm"):
        worst = max(abs(a[key] - r[key]) / r[key] for a, r in zip(got, ref))
        print(f"{case}: max relative {key} difference {worst:.1e}")
        assert_losses_close([m[key] for m in got], [m[key] for m in ref], rel=1e-6)
    if case.endswith("dp_ep"):  # the experts were split: tokens went to them by all-to-all
        assert all(m["ep_a2a_time_s"] > 0 and m["ep_a2a_calls"] > 0 for m in got)
    if case.endswith("dp_cp"):  # the attention went by all-to-all
        assert all(m["cp_collectives"] > 0 for m in got)


def test_config_json_alone_pretrains(runs):
    losses = [m["loss"] for m in metrics(runs["scratch"])]
    assert len(losses) == STEPS and all(5.0 < x < 6.0 for x in losses)  # ln(256) = 5.55: the architecture's init
    summary = json.loads((runs["scratch"] / "summary.json").read_text())
    assert "bf16" in json.dumps(summary["precision"])


@pytest.mark.parametrize("name", [name for name, (_, exported) in MODELS.items() if exported])
def test_run_exports_with_transformers_logits(runs, tmp_path, name):
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from models.spec import builder_kwargs
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    case = f"{name}_{MODELS[name][1]}"
    checkpoint = find_checkpoint(runs[case])
    module = instantiate(builder_kwargs(read_marker(checkpoint)["model"])).eval()
    module.load_state_dict(full_state(checkpoint))
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for dtype, cast in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        out = export(runs[case], tmp_path / dtype, dtype=dtype)
        hf = AutoModelForCausalLM.from_pretrained(out, dtype=cast).eval()
        with torch.no_grad():
            module.to(cast)  # in the export's dtype, its buffers (rotary tables ...) as transformers keeps them
            buffers = dict(hf.named_buffers())
            for key, buffer in module.named_buffers():
                buffer.data = buffers[key if key in buffers else f"model.{key}"].clone()
            diff = max_logit_difference(module(tokens), hf(tokens).logits)
        print(f"{case}: exported after {STEPS} steps ({dtype}), max |logit difference| in transformers {diff:.2e}")
        assert diff <= 1e-5


def test_lora_under_tp_matches_single_and_exports_a_peft_adapter(runs, folders, tmp_path):
    """The dp2 x tp2 LoRA run reproduces the single LoRA run (losses; gradient norms: the adapters', B's alone at
    step 1, A's too at step 2), which starts at the base model's loss (B is zero); its PEFT export, loaded by peft
    over the folder, gives meshtrain's logits."""
    from hydra.utils import instantiate
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from models.lora import LoRA, apply_lora
    from models.spec import builder_kwargs
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    (single, split), base = (metrics(runs[case]) for case in LORA_CASES), metrics(runs["deepseek_v3_single"])
    assert len(split) == STEPS
    assert_losses_close([single[0]["loss"]], [base[0]["loss"]], rel=1e-6)
    for key in ("loss", "grad_norm"):
        worst = max(abs(a[key] - r[key]) / r[key] for a, r in zip(split, single))
        print(f"deepseek_v3_lora_dp_tp: max relative {key} difference {worst:.1e}")
        assert_losses_close([m[key] for m in split], [m[key] for m in single], rel=1e-6)
    job = runs["deepseek_v3_lora_dp_tp"]
    checkpoint = find_checkpoint(job)
    model_cfg = read_marker(checkpoint)["model"]
    module = instantiate(builder_kwargs(model_cfg)).eval()
    assert len(apply_lora(module, LoRA.of(model_cfg))) == 3 * 4  # 3 in each of 4 layers
    module.load_state_dict(full_state(checkpoint))
    out = export(job, tmp_path / "adapter")
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folders["deepseek_v3"]), out).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), tuned(tokens).logits)
    print(f"deepseek_v3_lora_dp_tp: PEFT adapter after {STEPS} steps, max |logit difference| in peft {diff:.2e}")
    assert diff <= 1e-5
