"""The DeepSeek-V3 family's ``ModelSpec``: MLA's and the experts' sizes for the planner, the checks, the
``MoESpec`` naming the experts for expert parallel. No torch import."""

from __future__ import annotations

from typing import Any

from models.deepseek_v3.config import DeepseekV3Config
from models.llama.spec import llama_resized
from models.shape import ModelShape
from models.spec import ModelSpec, MoESpec, PipelineUnits, SubBlockTP, TPPlan, init_problems, size_problems

EXPERT_IMPLS = ("auto", "grouped_mm", "loop")  # models/moe.py's, written here without importing torch
SCORE_FUNCS = ("softmax", "sigmoid")  # models/moe.py's


def sparse_flags(model: Any) -> tuple[bool, ...]:
    """Per layer, whether it is a mixture of experts: every layer from ``first_k_dense_replace`` on."""
    return tuple(i >= int(model.first_k_dense_replace) for i in range(int(model.n_layers)))


def deepseek_shape(model: Any) -> ModelShape:
    """MLA's projections and norms, the dense layers' SwiGLU, the sparse layers' routed and shared experts."""
    sparse, width = sparse_flags(model), int(model.moe_d_ff)
    k, shared, dense = int(model.top_k), int(model.n_shared_experts), int(model.d_ff)
    return ModelShape(
        name=str(model.get("name", "deepseek_v3")),
        n_layers=int(model.n_layers),
        d_model=int(model.d_model),
        n_heads=int(model.n_heads),
        vocab_size=int(model.vocab_size),
        max_seq_len=int(model.max_seq_len),
        layer_d_ff=tuple((k + shared) * width if s else dense for s in sparse),
        tied_embeddings=bool(model.get("tie_embeddings", False)),
        gated_mlp=True,
        norm_params=1,
        learned_positions=False,
        head_dim=int(model.qk_nope_head_dim) + int(model.qk_rope_head_dim),
        kv_lora_rank=int(model.kv_lora_rank),
        q_lora_rank=int(model.q_lora_rank),
        qk_rope_head_dim=int(model.qk_rope_head_dim),
        v_head_dim=int(model.v_head_dim),
        sparse=sparse,
        score_func=str(model.score_func),
        n_group=int(model.n_group),
        topk_group=int(model.topk_group),
        sequence_aux_loss=True,
        n_experts=int(model.n_experts),
        top_k=k,
        moe_d_ff=width,
        n_shared_experts=shared,
        mtp_depth=int(model.get("mtp_depth", 0) or 0),
    )


POSITIVE = ("vocab_size", "n_layers", "d_model", "n_heads", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
NON_NEGATIVE = {
    "q_lora_rank": "0 means one query projection",
    "qk_nope_head_dim": "0 means rotary channels only",
    "n_shared_experts": "0 means none",
    "first_k_dense_replace": "0 means every layer sparse",
    "mtp_depth": "0 means no multi-token prediction",
}


def deepseek_problems(model: Any) -> list[str]:
    out = size_problems(model, positive=POSITIVE, non_negative=NON_NEGATIVE)
    if out:
        return out
    if int(model.qk_rope_head_dim) % 2:
        out.append(f"model.qk_rope_head_dim={model.qk_rope_head_dim}: rotary channels come in pairs; use an even one")
    experts, k = int(model.n_experts), int(model.top_k)
    if experts < 1 or not 1 <= k <= experts:
        out.append(f"model.n_experts={experts}, model.top_k={k}: need 1 <= top_k <= n_experts")
    groups, topk_group = int(model.n_group), int(model.topk_group)
    if groups < 1 or experts % groups or not 1 <= topk_group <= groups:
        out.append(
            f"model.n_group={groups}, model.topk_group={topk_group}: groups must divide model.n_experts={experts} "
            "and 1 <= topk_group <= n_group (1, 1: no group limit)"
        )
    elif groups > 1 and topk_group * (experts // groups) < k:
        out.append(f"model.topk_group={topk_group} groups of {experts // groups} experts hold fewer than top_k={k}")
    if str(model.score_func) not in SCORE_FUNCS:
        out.append(f"model.score_func={model.score_func}: choose one of {', '.join(SCORE_FUNCS)}")
    if str(model.get("expert_impl", "auto")) not in EXPERT_IMPLS:
        out.append(f"model.expert_impl={model.expert_impl}: choose one of {', '.join(EXPERT_IMPLS)}")
    if float(model.get("mtp_loss_weight", 0.0)) < 0:
        out.append(f"model.mtp_loss_weight={model.mtp_loss_weight}: a weight >= 0 (DeepSeek-V3: 0.3, then 0.1)")
    if float(model.get("capacity_factor", 0.0)) < 0:
        out.append(f"model.capacity_factor={model.capacity_factor}: 0 (no token dropped) or a positive factor")
    scaling = model.get("rope_scaling")
    if (
        scaling
        and float(scaling["factor"])
        and (float(scaling["factor"]) < 1 or int(scaling["original_max_seq_len"]) < 1)
    ):
        out.append(f"model.rope_scaling={dict(scaling)}: YaRN needs factor >= 1 and a positive original_max_seq_len")
    return out + init_problems(model)


def deepseek_tp_problems(model: Any, tp: int) -> list[str]:
    """Whole query heads per tp rank, the dense layers' width split, and the query's down-projection (the plan splits
    ``wq_b``: a model with one query projection, ``q_lora_rank=0``, has none)."""
    out = []
    if int(model.get("mtp_depth", 0)):
        out.append(
            f"model.mtp_depth={model.mtp_depth} with tp.size={tp}: the tensor-parallel plan does not split the MTP "
            "modules yet; use model.mtp_depth=0 or tp.size=1 (dp, fsdp, ep and pp run MTP)"
        )
    heads, d_ff = int(model.n_heads), int(model.d_ff)
    if heads % tp:
        out.append(f"model.n_heads={heads} is not divisible by tp.size={tp}: each tp rank owns whole MLA heads")
    if int(model.first_k_dense_replace) and d_ff % tp:
        out.append(f"model.d_ff={d_ff} (the dense layers' width) is not divisible by tp.size={tp}")
    if not int(model.q_lora_rank):
        out.append(
            f"model.q_lora_rank=0 with tp.size={tp}: the tensor-parallel plan splits the query's up-projection "
            "wq_b, which a model without the query down-projection lacks; use tp.size=1 (ep, pp, cp and fsdp run)"
        )
    return out


SPEC = ModelSpec.decoder(
    DeepseekV3Config,
    # the last stage holds the final norm, the head and the MTP modules (``mtp``, when model.mtp_depth > 0)
    pipeline=PipelineUnits(pre=("tok_embeddings",), post=None),
    loss="models.mtp:mtp_token_cross_entropy",
    context_parallel=True,  # MLA calls self.attend over (b, t, heads, d): the all-to-all splits its heads
    # MLA's heads split: wq_b and wkv_b column-wise, wo row-wise; wq_a, wkv_a and the latent norms replicated (their
    # gradients full after the column-wise backward's all-reduce), the shared rotary key's gradient summed over tp;
    # a sparse layer's feed-forward (marked by its router) whole on every tp rank, a dense one split as Llama's
    tp_plan=TPPlan(
        sub_blocks=(
            SubBlockTP(
                module="attention",
                norm="attention_norm",
                colwise=("wq_b", "wkv_b"),
                rowwise="wo",
                extra_inputs=1,
                replicated=("wq_a", "wkv_a"),
                shared=("rope_key",),
            ),
            SubBlockTP(module="feed_forward", norm="ffn_norm", colwise=("w1", "w3"), rowwise="w2", whole_if="router"),
        ),
        block_extra_inputs=1,
    ),
    tp_check=deepseek_tp_problems,
    shape=deepseek_shape,
    check=deepseek_problems,
    hf_adapter="models.deepseek_v3.hf_adapter:ADAPTER",
    resized=llama_resized,
    moe=MoESpec(
        experts=(
            "layers.*.feed_forward.experts.w1",
            "layers.*.feed_forward.experts.w2",
            "layers.*.feed_forward.experts.w3",
        ),
        router=("layers.*.feed_forward.router.weight",),
        n_experts=lambda model: int(model.n_experts),
        top_k=lambda model: int(model.top_k),
    ),
    description="DeepSeek-V3: MLA attention, dense first layers, shared + group-limited sigmoid-routed experts",
)
