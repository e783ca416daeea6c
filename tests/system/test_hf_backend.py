"""The Hugging Face backend (``models/hf_transformers``) runs transformers' own modules: for tiny random models of
nine architectures transformers writes (mistral, gemma3_text with sliding and global layers, phi3, olmo2, granite,
smollm3, mixtral, deepseek_v3, gpt_oss), the model read from the folder through the backend's adapter gives
transformers' logits (1e-5), packed documents give each document its own logits, a meta-device build initialised by
the architecture's ``_init_weights`` is finite, and ``model.init_from=DIR`` alone picks the backend only where no
native family reads the folder. In-process."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.hf_helpers import ARCHITECTURES, save_architecture


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("arch")
    return {name: save_architecture(name, base / name) for name in ARCHITECTURES}


def backend_model(folder):
    from models.hf_transformers.config import HFTransformersConfig
    from models.hf_transformers.model import HFCausalLM
    from trainer.hf.load import load_hf_weights

    config = HFTransformersConfig(config_dir=str(folder), init_from=str(folder))
    with torch.device("meta"):
        model = HFCausalLM(config)
    model.to_empty(device="cpu")
    model.init_buffers()
    load_hf_weights(model, folder=folder, model_cfg=config)
    return model.eval()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_backend_gives_transformers_logits(folders, name):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(folders[name]).eval()
    model = backend_model(folders[name])
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (model(tokens) - ref(tokens).logits).abs().max().item()
    print(f"{name}: max |logit difference| {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.parametrize("name", ["mistral", "gemma3_text", "gpt_oss"])
def test_packed_documents_see_only_themselves(folders, name):
    model = backend_model(folders[name])
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(12), torch.arange(20)]).expand(2, 32)
    with torch.no_grad():
        packed = model(torch.stack([tokens, positions], 1))
        alone = model(tokens[:, 12:])
    assert (packed[:, 12:] - alone).abs().max().item() <= 1e-5


def test_meta_build_takes_the_architectures_init(folders):
    from models.hf_transformers.config import HFTransformersConfig
    from models.hf_transformers.model import HFCausalLM

    with torch.device("meta"):
        model = HFCausalLM(HFTransformersConfig(config_dir=str(folders["gemma3_text"])))
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    std = model.layers["0"].mlp.up_proj.weight.std().item()
    assert abs(std - 0.02) < 0.002  # initializer_range
    assert torch.all(model.layers["0"].input_layernorm.weight == 0)  # Gemma's (1 + weight) norms start at 0
    assert model.embed_tokens.embed_scale.item() == pytest.approx(64**0.5)  # its non-persistent buffer
    assert model(torch.zeros(1, 8, dtype=torch.long)).isfinite().all()


def test_init_from_alone_picks_the_backend_only_without_a_native_family(compose_cfg, folders, tmp_path):
    from tests.hf_helpers import hf_model, save_folder
    from trainer.hf.start import InitFromError, adopt

    mistral = str(folders["mistral"])
    cfg = compose_cfg("parallel=single", f"model.init_from={mistral}")
    adopt(cfg, overrides=[f"model.init_from={mistral}"])
    assert cfg.model.family == "hf" and cfg.model.config_dir == mistral
    llama = save_folder(hf_model("llama", vocab_size=256), tmp_path / "llama")
    cfg = compose_cfg("parallel=single", f"model.init_from={llama}")
    adopt(cfg, overrides=[f"model.init_from={llama}"])
    assert cfg.model.family == "llama"  # the native family stays the default
    cfg = compose_cfg("parallel=single", f"model.init_from={llama}", "model.backend=transformers")
    adopt(cfg, overrides=[f"model.init_from={llama}", "model.backend=transformers"])
    assert cfg.model.family == "hf"
    cfg = compose_cfg("parallel=single", f"model.init_from={mistral}", "model.backend=native")
    with pytest.raises(InitFromError, match="model.backend=auto or transformers runs it"):
        adopt(cfg, overrides=[f"model.init_from={mistral}", "model.backend=native"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shutil.copy(folders["mistral"] / "config.json", scratch / "config.json")
    cfg = compose_cfg("parallel=single", f"model.init_from={scratch}")
    with pytest.raises(InitFromError, match=f"from random weights: model=hf model.config_dir={scratch}"):
        adopt(cfg, overrides=[f"model.init_from={scratch}"])


def test_remote_code_is_never_implicit(compose_cfg, folders, tmp_path):
    from trainer.hf.start import InitFromError, adopt

    remote = tmp_path / "remote"
    shutil.copytree(folders["mistral"], remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyModel"}
    (remote / "config.json").write_text(json.dumps(config))
    cfg = compose_cfg("parallel=single", f"model.init_from={remote}")
    with pytest.raises(InitFromError, match="model.trust_remote_code=true"):
        adopt(cfg, overrides=[f"model.init_from={remote}"])


def refusal(compose_cfg, *overrides: str) -> str:
    from trainer.validate import ConfigError, validate

    with pytest.raises(ConfigError) as exc:
        validate(compose_cfg(*overrides))
    return str(exc.value)


def test_what_an_architecture_cannot_do_is_refused_before_spawn(compose_cfg, folders):
    from trainer.validate import validate

    gpt_oss, mistral = (f"model.config_dir={folders[n]}" for n in ("gpt_oss", "mistral"))
    validate(compose_cfg("parallel=tp", "model=hf", mistral, "data.seq_len=32"))  # its plan splits heads by 2
    msg = refusal(compose_cfg, "parallel=tp", "model=hf", gpt_oss, "data.seq_len=32")
    assert "transformers gives this architecture no tensor-parallel plan for its attention" in msg
    assert "use tp.size=1 and shard with parallel=fsdp" in msg
    msg = refusal(compose_cfg, "parallel=tp", "tp.size=4", "topology.nproc_per_node=4", "model=hf", mistral)
    assert "tp.size=4 does not divide config.json's num_key_value_heads=2" in msg
    msg = refusal(compose_cfg, "parallel=tp", "tp.sequence_parallel=true", "model=hf", mistral, "data.seq_len=32")
    assert "keeps the residual stream replicated (ModelSpec.sequence_parallel); set tp.sequence_parallel=false" in msg


def test_context_parallel_is_refused_where_attention_is_more_than_causal(compose_cfg, folders):
    from trainer.validate import validate

    gpt_oss, mistral = (f"model.config_dir={folders[n]}" for n in ("gpt_oss", "mistral"))
    cp = ("parallel=hybrid", "dp.size=1", "tp.size=1", "pp.size=1", "cp.size=2", "model=hf")
    validate(compose_cfg(*cp, mistral, "data.seq_len=8"))  # the window (8) covers the sequence: plain causal
    msg = refusal(compose_cfg, *cp, mistral, "data.seq_len=32")
    assert "its sliding-window layers (sliding_window=8 < data.seq_len=32)" in msg and "use cp.size=1" in msg
    msg = refusal(compose_cfg, *cp, gpt_oss, "data.seq_len=8")
    assert "its attention sinks: not in context parallel's causal kernel" in msg


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_planner_shape_counts_the_built_model(folders, name):
    """The ModelShape from config.json (the planner's, the dry run's, the memory check's) holds exactly the built
    model's parameters, and a mixture of experts' active ones are fewer."""
    from models.hf_transformers.config import HFTransformersConfig
    from models.hf_transformers.model import HFCausalLM
    from models.registry import model_shape

    config = HFTransformersConfig(config_dir=str(folders[name]))
    with torch.device("meta"):
        built = sum(p.numel() for p in HFCausalLM(config).parameters())
    shape = model_shape(config)
    assert shape.params == built
    assert (shape.active_params < shape.params) == (name in ("mixtral", "deepseek_v3", "gpt_oss"))


def test_expert_parallel_needs_experts(compose_cfg, folders):
    from trainer.validate import validate

    moe = ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1", "model=hf", "data.seq_len=32")
    validate(compose_cfg(*moe, f"model.config_dir={folders['gpt_oss']}"))
    msg = refusal(compose_cfg, *moe, f"model.config_dir={folders['mistral']}")
    assert "expert parallel splits a mixture of experts' experts and this model has none; set ep.size=1" in msg


#: (architecture, layout) the planner's dry run checks: a sliding window under tp, sliding and global layers, MLA
#: experts split over ep, gpt-oss's eager attention with sinks and its clamped experts over two pipeline stages
PLANNED = {
    "mistral": {"tp": 2, "micro_batches": 2},
    "gemma3_text": {"dp": 2, "micro_batches": 2},
    "deepseek_v3": {"dp": 2, "ep": 2, "zero_stage": 3},
    "gpt_oss": {"pp": 2, "micro_batches": 2, "schedule": "1f1b"},
}


@pytest.mark.parametrize("name", list(PLANNED))
def test_dry_run_measures_the_plan(folders, name):
    """``python -m parallel.plan model.init_from=DIR`` plans the folder's architecture (``model.backend=transformers``
    for DeepSeek-V3, which a native family reads), and the dry run of a layout agrees with the plan on every sampled
    rank: model state exactly, saved activations within 10% (the issue's bound; measured within 8%, bf16 DeepSeek-V3
    at 0.92 the widest, fp32 within 4%). The MoE families' experts run on fake tensors too (balanced routing)."""
    from parallel.plan.cli import model_from_folder
    from parallel.plan.cost_model import Candidate
    from parallel.plan.dry_run import dry_run
    from tests.planning import plan_cfg, planner_inputs

    overrides = [f"model.init_from={folders[name]}", "model.backend=transformers", "data.seq_len=32"]
    overrides += ["data.global_batch_size=4", "topology.nproc_per_node=2"]
    cfg = plan_cfg(*overrides)
    model_from_folder(cfg, overrides)
    assert cfg.model.family == "hf"
    model_config, (model, hardware, workload) = planner_inputs(cfg)
    candidate = Candidate(**PLANNED[name])
    report = dry_run(
        model_config=model_config,
        candidate=candidate,
        model=model,
        hardware=hardware,
        workload=workload,
        ranks=[candidate.world_size - 1],  # the last stage: the head's too
    )
    for r in report.ranks:
        assert r.error is None, r.error
        assert r.ratio("model_state") == pytest.approx(1.0, abs=1e-6), r
        print(
            f"{name} {PLANNED[name]} rank {r.rank}: activations measured / planned "
            f"{r.ratio('activations_per_micro_batch'):.4f}"
        )
        assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.10), r


def test_activation_checkpointing_recomputes_transformers_blocks(folders):
    """trainer.activation_checkpointing wraps transformers' decoder layers as it wraps meshtrain's blocks (called with
    their masks and rotary tables as keywords): Gemma 3's sliding and global layers recomputed, whole or all but
    their matmuls, give the same loss and gradients as without it."""
    from parallel.techniques.checkpointing import apply_activation_checkpointing

    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    runs = {}
    for mode in ("none", "full", "selective"):
        model = backend_model(folders["gemma3_text"]).train()
        apply_activation_checkpointing(model, mode=mode)
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        runs[mode] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    plain, want = runs.pop("none")
    for mode, (loss, got) in runs.items():
        assert torch.allclose(loss, plain, rtol=1e-6, atol=0), mode
        for name, grad in want.items():
            assert torch.allclose(got[name], grad, rtol=1e-5, atol=1e-7), (mode, name)


def test_lora_targets_take_transformers_names(compose_cfg, folders):
    """LoRA's default targets are meshtrain's layer names (wq, wv): with the backend they are refused before spawn,
    naming transformers' (q_proj, v_proj), which pass."""
    from trainer.validate import validate

    mistral = ("parallel=single", "model=hf", f"model.config_dir={folders['mistral']}", "model.lora.rank=4")
    msg = refusal(compose_cfg, *mistral)
    assert "the Hugging Face backend runs transformers' modules" in msg and "model.lora.targets=[q_proj,v_proj]" in msg
    validate(compose_cfg(*mistral, "model.lora.targets=[q_proj,v_proj]"))
    from models.lora import LoRA, apply_lora, init_lora

    model = backend_model(folders["mistral"]).train()
    assert len(apply_lora(model, LoRA(rank=4, targets=("q_proj", "v_proj")))) == 2 * 4  # 4 layers
    init_lora(model, seed=0)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all(".lora_" in n for n in trained)
