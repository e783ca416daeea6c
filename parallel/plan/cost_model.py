"""How much memory a rank needs and how long a step takes, for one layout, from the config alone.

Every term is a closed formula from a paper, named in its docstring; ``estimate`` adds them up. Notation
as in Megatron-LM: s sequence length, b micro-batch size (samples), h hidden size, a heads, L layers,
V vocabulary, t tensor-parallel size, p pipeline size, v virtual stages per rank, m micro-batches, n
data-parallel size, c context-parallel size (each rank holds s/c tokens of every sample), ep expert-parallel size
(each MoE layer's E experts split into ep sets; ep borrows its ranks from n x c), k experts per token, Ψ parameters. No torch import: ``python -m parallel.plan`` plans for a 1024-GPU
cluster on a laptop.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from models.shape import kv_repeats
from parallel.foundation.dims import Sized, lenders, multiplying, with_dim_kwargs
from parallel.pipeline.schedules import SCHEDULES, schedule_spec, stage_to_rank
from parallel.plan.muon_cost import MuonCost, muon_step_cost, rank_muon_params
from parallel.plan.specs import HardwareSpec, Link, ModelShape, Workload, count_text

#: schedules the cost model knows (their bubble and in-flight rules are on ``ScheduleSpec``)
MODELED_SCHEDULES = tuple(name for name, spec in SCHEDULES.items() if spec.modeled)
#: torch's default DDP buckets (``dp.bucket_cap_mb`` null, as the trainer builds DDP): the first 1 MiB
#: (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), then 25 MiB each (DDP's ``bucket_cap_mb`` default)
DDP_FIRST_BUCKET_BYTES = 2**20
DDP_BUCKET_BYTES = 25 * 2**20


def ddp_buckets(grad_bytes: float) -> int:
    """Gradient buckets DDP all-reduces for ``grad_bytes`` of gradients with torch's default sizes."""
    rest = max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / DDP_BUCKET_BYTES)


@with_dim_kwargs
@dataclass(frozen=True)
class Candidate(Sized):
    """One layout the planner may choose: degrees, micro-batching, schedule, sharding, recomputation."""

    sizes: dict[str, int] = field(default_factory=dict)
    """Degree per mesh dimension (``parallel/foundation/dims.py``), read as ``c.dp``, ``c.tp`` ...;
    ``Candidate(dp=2, tp=2)`` fills it."""
    micro_batches: int = 1
    schedule: str = "none"
    """``none`` when pp == 1 (gradient accumulation over micro_batches), else one of MODELED_SCHEDULES."""
    stages_per_rank: int = 1
    zero_stage: int = 0
    """0 DDP, 1 optimizer states, 2 + gradients, 3 + parameters sharded over dp (FSDP ``fully_shard``)."""
    sequence_parallel: bool = False
    recompute: str = "none"
    split_points: tuple[int, ...] | None = None
    """Block indices where a new (virtual) stage starts; None = uniform split."""
    dispatch: str = "flat"
    """How expert parallel sends a token's rows (``DISPATCHES``): ``flat``, meshtrain's all-to-all (each of its
    k rows to its expert's rank); ``node_limited``, DeepSeek-V3's (DeepEP): one copy per destination node over the
    inter-node link, forwarded to the experts inside the node, a token's experts on at most ``topk_group`` nodes.
    The search ranks ``flat`` only (what meshtrain runs); ``--layout ... dispatch=node_limited`` prices the other."""


@dataclass(frozen=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float
    reference: float = 0.0
    """A frozen reference model's weights (``Workload.reference_copy`` without LoRA): sharded as ``params``, no
    gradients or optimizer state."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.reference


@dataclass(frozen=True)
class Estimate:
    candidate: Candidate
    memory: Memory
    """Bytes on the rank that needs the most (pipeline stage 0 holds the most micro-batches)."""
    step_time_s: float
    compute_s: float
    bubble_fraction: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    stage_times_s: tuple[float, ...]
    fits: bool
    budget_bytes: float
    cp_comm_s: float = 0.0
    """Context parallel's all-to-alls (``cp_all_to_all_s``) on the bottleneck stage, per step."""
    ep_comm_s: float = 0.0
    """Expert parallel's all-to-alls (dispatch and combine, ``ep_all_to_alls_per_layer``) on the bottleneck stage,
    per step."""
    rank_memory: tuple[Memory, ...] = ()
    """Memory of every pipeline rank (``memory`` is the fullest)."""
    rank_activation_per_micro_batch: tuple[float, ...] = ()
    """Saved-activation bytes of one micro-batch on every pipeline rank (logits included on the last)."""
    rank_work_s: float = 0.0
    """A mean rank's CPU seconds per step, as the time-share floor counts them (its micro-batches, its AdamW and
    the measured CPU share of its fixed costs): what it takes from cores that ranks beyond them share."""
    muon: MuonCost = MuonCost()
    """``optim=muon``'s Newton-Schulz FLOPs and gathers on the fullest rank (in ``optimizer_s``; zero for AdamW)."""

    @property
    def comm_fraction(self) -> float:
        comm = self.tp_comm_s + self.cp_comm_s + self.ep_comm_s + self.pp_comm_s + self.dp_comm_s
        return comm / self.step_time_s if self.step_time_s else 0.0

    @property
    def stage_imbalance(self) -> float:
        """Slowest stage over the mean stage, minus one (0 = balanced)."""
        mean = sum(self.stage_times_s) / len(self.stage_times_s)
        return max(self.stage_times_s) / mean - 1 if mean > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            **self.candidate.flat_dict(),
            "memory_per_rank_bytes": {**asdict(self.memory), "total": self.memory.total},
            "step_time_s": self.step_time_s,
            "bubble_fraction": self.bubble_fraction,
            "comm_fraction": self.comm_fraction,
            "fits": self.fits,
            "breakdown_s": {
                "compute": self.compute_s,
                "tp_comm": self.tp_comm_s,
                "cp_comm": self.cp_comm_s,
                "ep_comm": self.ep_comm_s,
                "pp_comm": self.pp_comm_s,
                "dp_comm": self.dp_comm_s,
                "optimizer": self.optimizer_s,
            },
            "stage_imbalance": self.stage_imbalance,
        }


# ---- how layers are placed --------------------------------------------------------------------


def chunk_layers(n_layers: int, chunks: int) -> list[range]:
    """Uniform contiguous split of the blocks into ``chunks`` pieces, earlier pieces one larger."""
    base, extra = divmod(n_layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        size = base + (1 if c < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def chunks_at(n_layers: int, split_points: tuple[int, ...]) -> list[range]:
    bounds = [0, *split_points, n_layers]
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def rank_layers(
    n_layers: int, *, pp: int, stages_per_rank: int, schedule: str, split_points: tuple[int, ...] | None = None
) -> list[list[int]]:
    """Blocks held by each pipeline rank, placed as the schedule places its stages (``stage_to_rank``):
    chunk c goes to rank c mod p (Megatron's interleaving); a V schedule folds the second half back (rank r
    holds chunks r and 2p-1-r: arXiv 2401.10241, section 6)."""
    v = stages_per_rank
    if split_points is not None and len(split_points) == pp * v - 1:
        chunks = chunks_at(n_layers, split_points)
    else:
        chunks = chunk_layers(n_layers, pp * v)
    placed = stage_to_rank(placement=schedule_spec(schedule).placement, pp=pp, num_stages=len(chunks))
    ranks: list[list[int]] = [[] for _ in range(pp)]
    for r, layers in zip(placed, chunks):
        ranks[r].extend(layers)
    return ranks


def last_chunk_rank(*, pp: int, schedule: str, stages_per_rank: int) -> int:
    """The rank holding the last stage (the head): pp - 1, or rank 0 on a V placement."""
    return stage_to_rank(placement=schedule_spec(schedule).placement, pp=pp, num_stages=pp * stages_per_rank)[-1]


# ---- memory terms -----------------------------------------------------------------------------


def rank_trainable_params(model: ModelShape, layers: list[int], *, last: bool, tp: int, meshtrain: bool) -> float:
    """Parameters with gradients and optimizer state on one tensor-parallel rank of a pipeline rank: with LoRA
    (``model.lora_rank``) only the adapters of its blocks (and of the head on the last rank). meshtrain shards each
    adapter as its base (``models/tensor_parallel.py``): a column-wise layer's ``lora_B`` (out x r) over t, its
    ``lora_A`` whole; a row-wise layer's ``lora_A`` (r x in) over t, its ``lora_B`` whole (measured by the dry run)."""
    if model.lora_rank <= 0 or not meshtrain or tp == 1:
        return (
            sum(model.layer_trainable_params(i) for i in layers) + (model.head_trainable_params if last else 0)
        ) / tp
    linears = [x for i in layers for x in model.layer_adapted_linears(i)] + (model.head_adapted_linears if last else [])
    r = model.lora_rank
    return sum(
        r * (n_in / tp + n_out) if fqn.rsplit(".", 1)[-1] in model.rowwise_linears else r * (n_in + n_out / tp)
        for fqn, n_in, n_out in linears
    )


def rank_params(model: ModelShape, layers: list[int], *, first: bool, last: bool, tp: int, meshtrain: bool) -> float:
    """Parameters one tensor-parallel rank of a pipeline rank holds (before data-parallel sharding).

    Megatron-LM shards every block's matrices, the vocabulary-parallel embedding and the head over t
    (norms are small and counted as sharded). meshtrain's tensor-parallel plans (``models/*/parallelize.py``)
    shard the blocks' projections and the output head, and replicate norms and embeddings, except a tied token
    embedding, which is split over the vocabulary as its head is (``models/tensor_parallel.py``), and a sparse
    layer's mixture of experts, which runs whole on every tp rank (router, experts, shared experts: its experts
    are split by expert parallel instead, ``rank_expert_params``).
    """
    groups = model.layer_groups(layers)
    params = sum(n * model.layer_params(i) for i, n in groups)
    embedding = model.embedding_params if first else 0
    head = model.head_params if last else 0
    if last and (model.tied_embeddings or model.mtp_depth) and not first:  # the embedding's copy (the head, MTP)
        head += model.vocab_size * model.d_model
    if not meshtrain or tp == 1:
        return (params + embedding + head) / tp
    whole = sum(n * (model.layer_norm_params(i) + model.layer_moe_params(i)) for i, n in groups)  # not split over tp
    head_norm = model.head_params - (0 if model.tied_embeddings else model.vocab_size * model.d_model) if last else 0
    tied = model.vocab_size * model.d_model if first and model.tied_embeddings else 0
    return (params - whole + head - head_norm + tied) / tp + whole + embedding - tied + head_norm


def rank_expert_params(model: ModelShape, layers: list[int], *, tp: int, meshtrain: bool) -> float:
    """The routed experts among ``rank_params`` (one tp rank of a pipeline rank, before expert and data parallel):
    whole on every tp rank in meshtrain, split over t as Megatron-LM's expert tensor parallel does otherwise.
    Expert parallel divides them by ep, then FSDP2 shards them over the experts' own mesh, the n·c/ep ranks that
    hold the same experts (``parallel/foundation/meshes.py`` ``expert_meshes``; torchtitan's ``dp_shard_mod_ep``)."""
    experts = sum(n * model.layer_expert_params(i) for i, n in model.layer_groups(layers))
    return experts if meshtrain else experts / tp


def model_state_bytes(
    params: float, *, bytes_per_param: tuple[int, int, int], zero_stage: int, dp: int
) -> tuple[float, float, float]:
    """Weights, gradients, optimizer states of ``params`` parameters on one rank.

    ZeRO (arXiv 1910.02054, section 5, Figure 1): with w, g, K bytes per parameter (2, 2, 12 in mixed
    precision with Adam) a DDP rank holds (w + g + K)Ψ; stage 1 (P_os) shards K over N_d, stage 2
    (P_os+g) also g, stage 3 (P_os+g+p) also w. Paper example, Ψ = 7.5B, N_d = 64: 120 GB, 31.4 GB, 16.6 GB,
    1.9 GB.
    """
    w, g, k = bytes_per_param
    return (
        params * w / (dp if zero_stage >= 3 else 1),
        params * g / (dp if zero_stage >= 2 else 1),
        params * k / (dp if zero_stage >= 1 else 1),
    )


def rank_state_bytes(
    model: ModelShape, layers: list[int], *, params: float, c: Candidate, workload: Workload, meshtrain: bool
) -> tuple[float, float, float]:
    """Weights, gradients, optimizer states of a pipeline rank holding ``params`` (``rank_params``): its routed
    experts divided by ep and then sharded (ZeRO) over the experts' own n·c/ep ranks, the rest over n·c. Under
    ZeRO-3 an expert therefore costs Ψ/(n·c) bytes per rank whatever ep is; expert parallel saves the experts'
    all-gathers and reduce-scatters instead (each rank gathers 1/ep of them: ``estimate``'s data-parallel time).
    With ``optim=muon`` the blocks' matrices (experts included) keep one momentum buffer instead of two moments
    (``parallel/plan/muon_cost.py``)."""
    data = c.dp * c.cp
    experts = rank_expert_params(model, layers, tp=c.tp, meshtrain=meshtrain)
    muon = workload.optimizer == "muon"
    matrices = rank_muon_params(model, layers, tp=c.tp, meshtrain=meshtrain) if muon else 0.0
    adam, orth = workload.bytes_per_param, workload.muon_bytes_per_param
    parts = (
        model_state_bytes(params - experts - matrices, bytes_per_param=adam, zero_stage=c.zero_stage, dp=data),
        model_state_bytes(matrices, bytes_per_param=orth, zero_stage=c.zero_stage, dp=data),
        model_state_bytes(
            experts / c.ep, bytes_per_param=orth if muon else adam, zero_stage=c.zero_stage, dp=data // c.ep
        ),
    )
    return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)


def rank_muon_state_params(
    model: ModelShape, layers: list[int], *, c: Candidate, workload: Workload, meshtrain: bool
) -> float:
    """Parameters whose Muon momentum a rank holding ``layers`` keeps, sharded as ``rank_state_bytes`` shards them
    (the blocks' matrices over n·c, the routed experts over ep and their own n·c/ep); 0 under AdamW or LoRA."""
    if workload.optimizer != "muon" or model.lora_rank > 0:
        return 0.0
    data, count = c.dp * c.cp, (0, 0, 1)  # one state per parameter: model_state_bytes's sharding as a count
    matrices = rank_muon_params(model, layers, tp=c.tp, meshtrain=meshtrain)
    experts = rank_expert_params(model, layers, tp=c.tp, meshtrain=meshtrain) / c.ep
    return (
        model_state_bytes(matrices, bytes_per_param=count, zero_stage=c.zero_stage, dp=data)[2]
        + model_state_bytes(experts, bytes_per_param=count, zero_stage=c.zero_stage, dp=data // c.ep)[2]
    )


@dataclass(frozen=True)
class ActivationCase:
    """What a block's saved activations depend on besides the model: one micro-batch's shape, the tp degree,
    sequence parallel, the recomputation mode and the activation element size (bytes)."""

    seq_len: int
    """Tokens of each sample this rank holds: the sequence / cp."""
    micro_batch: float
    tp: int
    sequence_parallel: bool
    recompute: str
    element_bytes: int
    cp: int = 1
    """Context-parallel degree: attention spans the whole sequence, seq_len x cp (Megatron-LM's s² scores; meshtrain's
    all-to-all output copy and key/value heads repeated when cp exceeds them)."""
    ep: int = 1
    """Expert-parallel degree: above 1 a MoE block also keeps the all-to-all's reordering indices."""


def layer_activation_bytes(model: ModelShape, layer: int, case: ActivationCase) -> float:
    """Activations one block keeps for its backward pass, for one micro-batch.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198,
    section 4, 16-bit activations, 1-byte dropout masks): sbh(34 + 5as/h) without parallelism, of which
    attention 11sbh + 5as²b, MLP 19sbh, LayerNorms 4sbh. With tensor parallel t: sbh(10 + 24/t + 5as/(ht));
    with sequence parallel as well everything is divided by t; selective recomputation drops the 5as²b
    attention term; full recomputation keeps only the block's input, 2sbh (divided by t with sequence
    parallel). The MLP's 19sbh is written here as 3sbh + 4sb·d_ff so that d_ff ≠ 4h works; other element
    sizes scale the whole formula by element_bytes / 2 (masks included: a slight overestimate in fp32). With
    context parallel c, s is the rank's s/c tokens; its a/c heads' scores span the whole sequence: 5as²b/c.
    """
    s, b, h, a, f = case.seq_len, case.micro_batch, model.d_model, model.n_heads, model.layer_d_ff[layer]
    tp, sequence_parallel, recompute = case.tp, case.sequence_parallel, case.recompute
    scale = case.element_bytes / 2
    if recompute == "full":
        return scale * 2 * s * b * h / (tp if sequence_parallel else 1)
    unsharded = 10 * s * b * h  # LayerNorm inputs and the attention/MLP inputs (replicated without SP)
    sharded = s * b * (8 * h + 4 * f)  # 34sbh - 10sbh with d_ff = 4h: Q, K, V, projections, MLP
    scores = 0.0 if recompute == "selective" else 5 * a * s * (s * case.cp) * b
    if sequence_parallel or tp == 1:
        return scale * (unsharded + sharded + scores) / tp
    return scale * (unsharded + (sharded + scores) / tp)


#: bytes of the float32 values meshtrain's blocks save whatever the activation precision: SDPA's log-sum-exp,
#: RMSNorm's input, normalised input and statistic (CPU autocast runs RMSNorm in fp32) and the log-probabilities
FP32_BYTES = 4
#: bytes of one int64 target the loss saves per token
TARGET_BYTES = 8


def norm_saved_bytes(model: ModelShape, width: int, *, element_bytes: int) -> float:
    """What one norm over ``width`` channels saves per row (token, or token x head) for backward, in bytes.

    LayerNorm (``norm_params`` 2): its input and its mean and reciprocal standard deviation, in the activation
    dtype (CPU autocast runs ``layer_norm`` in bf16). RMSNorm (``norm_params`` 1; ``nn.RMSNorm`` is composite in
    torch 2.13): its input, the normalised input (for the weight's gradient) and the reciprocal RMS, in fp32 under
    autocast too (it upcasts the bf16 input and saves the copy). Measured with the dry run's hook (torch 2.13, CPU).
    """
    if model.norm_params == 1:
        return (2 * width + 1) * FP32_BYTES
    return (width + 2) * element_bytes


def attention_saved_bytes(model: ModelShape, case: ActivationCase) -> float:
    """What one attention (its input projections' input to its output projection) saves per token, in bytes.

    Without recomputation: the normed input the wq, wk, wv projections share, h·e (replicated over t; the
    all-gathered input under sequence parallel); what SDPA saves (``scaled_dot_product_attention``, a fused
    kernel: no s² scores): the rotated q, k and v, its output and its log-sum-exp, (2·q_dim + 2·kv_dim·r)·e/t +
    a·4/t, where r repeats the key/value heads when cp exceeds them (``kv_repeats``; the rotation itself saves
    only the shared rotary table, not counted: under 0.3%); under cp the output's all-to-all back to the sequence
    split is a new tensor wo saves, q_dim·e/t; with per-head q/k norms (Qwen3) each RMSNorm's input and
    statistics on (a + kv heads)/t heads (``norm_saved_bytes``).
    Selective recomputation keeps the matmul outputs: q, k, v ((q_dim + 2·kv_dim)·e/t), SDPA's output and
    log-sum-exp, and wo's output (h·e: the partial sums before tensor parallel's reduction).
    """
    h, q, kv, a, t, e = model.d_model, model.q_dim, model.kv_dim, model.n_heads, case.tp, case.element_bytes
    lse = a * FP32_BYTES / t
    if model.kv_lora_rank and case.recompute == "none":
        return mla_saved_bytes(model, case)
    if case.recompute == "selective":
        return (q + 2 * kv + q) * e / t + lse + h * e
    r = kv_repeats(model.n_kv_heads // t, case.cp)
    saved = h * e + (2 * q + 2 * kv * r) * e / t + lse + (q * e / t if case.cp > 1 else 0.0)
    if model.qk_norm:
        saved += (model.n_heads + model.n_kv_heads) * norm_saved_bytes(model, model.head_dim, element_bytes=e) / t
    return saved


def mla_saved_bytes(model: ModelShape, case: ActivationCase) -> float:
    """What one multi-head latent attention (``models/deepseek_v3/model.py: MLA``) saves per token without
    recomputation, in bytes: the normed input the down-projections share, h·e; each latent norm's
    (``norm_saved_bytes`` over ``q_lora_rank`` and ``kv_lora_rank``) and the up-projections' inputs, (q_rank +
    kv_rank)·e; what SDPA saves, q, k and the values padded to the query/key width and its output, 4·a·d·e/t, and its
    log-sum-exp a·4/t (d: nope + rope channels); the cut-back output ``wo`` reads, a·v·e/t. The latent terms are
    replicated over tp (``wq_a``, ``wkv_a`` run whole on every rank). Counted from the tensors autograd saves (torch
    2.13, bf16 and fp32) and checked by the dry run."""
    a, t, e, d = model.n_heads, case.tp, case.element_bytes, model.head_dim
    latent = model.q_lora_rank + model.kv_lora_rank
    norms = sum(norm_saved_bytes(model, r, element_bytes=e) for r in (model.q_lora_rank, model.kv_lora_rank) if r)
    heads = (4 * a * d * e + a * FP32_BYTES + a * model.v_head_dim * e) / t
    return model.d_model * e + norms + latent * e + heads


def dense_mlp_saved_bytes(model: ModelShape, layer: int, case: ActivationCase) -> float:
    """What one dense MLP (``feed_forward``) saves per token, in bytes: the term a sparse layer's own replaces.

    Without recomputation: its normed input, h·e (shared by w1 and w3; replicated over t), and per d_ff channel
    (split over t): GELU's input and output (2), or SwiGLU's w1 and w3 outputs, silu's output and the product w2
    reads (4). Selective recomputation keeps the matmul outputs: w1's (and w3's) d_ff/t and w2's h (partial sums).
    """
    h, f, t, e = model.d_model, model.layer_d_ff[layer], case.tp, case.element_bytes
    matrices_in = 2 if model.gated_mlp else 1
    if case.recompute == "selective":
        return matrices_in * f * e / t + h * e
    return h * e + 2 * matrices_in * f * e / t


def mlp_saved_bytes(model: ModelShape, layer: int, case: ActivationCase) -> float:
    """What block ``layer``'s MLP saves per token, in bytes: the dense term (``dense_mlp_saved_bytes``), or a sparse
    layer's mixture of experts (``moe_saved_activation_bytes``, for the micro-batch, after its normed input: that
    input, h·e, is added here without recomputation, as the dense term counts its own)."""
    if not model.sparse[layer]:
        return dense_mlp_saved_bytes(model, layer, case)
    normed = model.d_model * case.element_bytes if case.recompute == "none" else 0.0
    return normed + moe_saved_activation_bytes(model, layer, case) / (case.seq_len * case.micro_batch)


def saved_layer_activation_bytes(model: ModelShape, layer: int, case: ActivationCase) -> float:
    """What one of meshtrain's blocks keeps for backward, for one micro-batch (bytes): a closed formula per family.

    Counted from the tensors autograd saves in the blocks of ``models/gpt/model.py`` and ``models/llama/model.py``
    (Qwen3 included) under DTensor tensor parallel and Ulysses context parallel (``parallel/techniques/cp.py``), as
    the dry run measures them (``parallel/plan/dry_run.py``: fake tensors, the saved-tensor hook, one count per
    storage; recomputation with the trainer's meter, ``parallel/foundation/activations.py``), per token: the block's two
    norms (``norm_saved_bytes``, /t with sequence parallel), its attention (``attention_saved_bytes``) and its
    MLP (``mlp_saved_bytes``: dense, or a sparse layer's mixture of experts). No dropout masks, no s² scores (Megatron-LM's ``layer_activation_bytes``
    counts both). Selective recomputation (the trainer's op-level policy: matmul and attention outputs kept, the
    rest recomputed) keeps the block's input, h·e (/t with sequence parallel), and those outputs; full
    recomputation keeps the block's input alone. Measured equal to the byte (GPT, Llama, Qwen3 x fp32 and bf16 x tp
    1 and 2 with and without sequence parallel x cp 1, 2 and 4 x each recomputation mode; 64 tokens); the tests
    (``tests/system/test_rotary_families_dry_run.py``, ``test_dry_run_fake_group.py``) hold whole stages to 1%.
    """
    tokens = case.seq_len * case.micro_batch
    shard_seq = case.tp if case.sequence_parallel else 1
    block_input = model.d_model * case.element_bytes / shard_seq
    if case.recompute == "full":
        return tokens * block_input
    if model.block_saved_bytes is not None and case.recompute == "none":  # counted on the block's own module
        return case.micro_batch * model.block_saved_bytes(layer, int(case.seq_len), case.element_bytes, case.tp)
    mlp = mlp_saved_bytes(model, layer, case)
    if case.recompute == "selective":
        return tokens * (block_input + attention_saved_bytes(model, case) + mlp)
    norms = 2 * norm_saved_bytes(model, model.d_model, element_bytes=case.element_bytes) / shard_seq
    return tokens * (norms + attention_saved_bytes(model, case) + mlp)


def rotary_table_saved_bytes(model: ModelShape, *, seq_len: int) -> float:
    """The rotary families' (cos, sin) table, saved once per pipeline stage by the first rotation (the complex
    multiply keeps its non-differentiable operand): an fp32 buffer of max(``max_seq_len``, the sequence) positions x
    head_dim values, the same storage for every block and micro-batch (counted with each micro-batch here, as the dry
    run counts it: an overcount of one table per further micro-batch in flight). 0 with learned positions (GPT)."""
    rotary = model.qk_rope_head_dim or model.head_dim  # MLA rotates its rotary channels only
    return 0.0 if model.learned_positions else max(model.max_seq_len, seq_len) * rotary * FP32_BYTES


def head_saved_bytes(model: ModelShape, case: ActivationCase) -> float:
    """What meshtrain's last stage keeps for the loss, for one micro-batch (bytes): the final norm's
    (``norm_saved_bytes``, /t with sequence parallel), the head's input, h·e (gathered), and the cross-entropy's
    fp32 log-probabilities, s·b·V·4, with its int64 targets. The logits themselves are not saved (fp32 logits feed
    ``log_softmax``; bf16 ones its fp32 copy) and, with ``tp.loss_parallel=false`` (the default), the head gathers
    the full vocabulary on every tp rank. Measured with the dry run's hook, as ``saved_layer_activation_bytes``."""
    shard_seq = case.tp if case.sequence_parallel else 1
    norm = norm_saved_bytes(model, model.d_model, element_bytes=case.element_bytes) / shard_seq
    per_token = norm + model.d_model * case.element_bytes + model.vocab_size * FP32_BYTES + TARGET_BYTES
    return case.seq_len * case.micro_batch * per_token


def moe_saved_activation_bytes(model: ModelShape, layer: int, case: ActivationCase) -> float:
    """What a sparse layer's mixture of experts (``models/moe.py``) keeps for backward after its normed input (the
    layer's formula counts that), for one micro-batch (bytes). Counted from the tensors autograd saves in
    ``MoE.forward`` and checked by the dry run on fake tensors; T = s·b tokens of this rank (the block runs whole
    on every tp rank: not divided by t), k experts per token, so T·k routed rows of h channels:

    - router: the softmax probabilities T·E fp32, the top-k ids T·k int64, the top-k weights T·k fp32 and their
      sum T fp32 (``norm_topk_prob``);
    - dispatch: each row's token and the sort order, 2·T·k int64 (under expert parallel also the received rows'
      reordering and its inverse, 2·T·k int64);
    - experts: their input rows T·k·h, and per row the SwiGLU's two projections, the SiLU output and the product,
      4·T·k·moe_d_ff; shared experts 4·T·(shared width) likewise;
    - combine: the rows' router weights T·k, the experts' outputs T·k·h and the weighted rows T·k·h (index_add's
      source);
    - the load-balancing loss: the expert fractions, E fp32.

    Selective recomputation (the trainer's op-level policy keeps matmul outputs only) keeps the router logits T·E,
    the experts' two input projections and output, 2·T·k·moe_d_ff + T·k·h. Full recomputation keeps the block
    input, which the layer's formula counts. Each mode matched exactly on one block, with and without ep
    (``tests/unit/test_planner_expert_parallel.py``).
    """
    tokens, k, n_experts, e = case.seq_len * case.micro_batch, model.top_k, model.n_experts, case.element_bytes
    rows, h, f, shared = tokens * k, model.d_model, model.moe_d_ff, model.moe_d_ff * model.n_shared_experts
    if case.recompute == "full":
        return 0.0
    if case.recompute == "selective":
        return tokens * n_experts * e + rows * (2 * f + h) * e + tokens * (2 * shared + h * (shared > 0)) * e
    router = tokens * n_experts * 4 + rows * (8 + 4) + tokens * 4
    if model.score_func == "sigmoid":  # an fp32 copy of the input and of the router weight
        router += tokens * h * 4 + n_experts * h * 4
    if model.n_group > 1:  # each group's two best (int64 ids) and the groups' mask
        router += tokens * model.n_group * (2 * 8 + 1)
    dispatch = 2 * rows * 8 * (2 if case.ep > 1 else 1)
    experts = rows * (h + 4 * f) * e + 4 * tokens * shared * e
    combine = rows * e + 2 * rows * h * e
    if model.sequence_aux_loss:  # per token the scores' sum, per sequence the expert fractions
        return router + dispatch + experts + combine + tokens * 4 + case.micro_batch * n_experts * 4
    return router + dispatch + experts + combine + n_experts * 4


def logits_bytes(model: ModelShape, *, seq_len: int, micro_batch: int, tp: int, element_bytes: int) -> float:
    """Megatron-LM's last stage keeps the logits (s·b·V) and an fp32 copy for cross entropy, split over t by the
    vocabulary-parallel head. Our estimate; arXiv 2205.05198 section 4.3 counts the output layer's 4sbh·V-scale
    term the same way."""
    return seq_len * micro_batch * model.vocab_size * (element_bytes + 4) / tp


def micro_batches_in_flight(schedule: str, *, pp: int, m: int, v: int, stage: int = 0) -> float:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak, at most m.

    Each schedule's rule, with its source, is its ``ScheduleSpec.in_flight`` (parallel/pipeline/schedules.py):
    GPipe and Looped BFS m; 1F1B, ZB-H1 and ZB-V p - i; interleaved 1F1B p - i + (p-1)/v.
    """
    if pp == 1:
        return 1.0
    return min(float(m), _modeled(schedule).in_flight(pp, m, v, stage))


# ---- time terms -------------------------------------------------------------------------------


def bubble_fraction(schedule: str, *, pp: int, m: int, v: int = 1) -> float:
    """Share of a pipelined step that stages sit idle (fill and drain), for equal stage times: idle / (m + idle).

    Each schedule's idle slots, with their source, are its ``ScheduleSpec.bubble_idle``: GPipe and 1F1B
    p - 1 ((p-1)/(m+p-1), Megatron-LM arXiv 2104.04473 eq. 1), interleaved and Looped BFS (p-1)/v (eq. 2),
    ZB-H1 (p-1)/3, ZB-V 0 once m >= 2p, (p-1)/2 below.
    """
    if pp <= 1:
        return 0.0
    idle = _modeled(schedule).bubble_idle(pp, m, v)
    return idle / (m + idle)


def _modeled(schedule: str):
    spec = schedule_spec(schedule)
    if not spec.modeled:
        raise KeyError(f"the cost model has no terms for pp.schedule={schedule}")
    return spec


def actions_per_micro_batch(schedule: str, *, v: int) -> int:
    """Pipeline actions one rank runs per micro-batch: F and B on each of its v stages, plus W for the
    zero-bubble schedules, which split B into input (I) and weight (W) gradients (arXiv 2401.10241)."""
    return v * (3 if schedule in ("zero_bubble", "zbv") else 2)


def all_to_all_s(nbytes: float, *, n: int, link: Link) -> float:
    """One all-to-all of a rank's ``nbytes`` buffer among n ranks: it keeps 1/n and sends (n-1)/n, one message to
    each other rank (the pairwise exchange; DeepSpeed-Ulysses, arXiv 2309.14509, section 3.2)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.bytes_per_s + (n - 1) * link.latency_s


#: ``Candidate.dispatch`` choices
DISPATCHES = ("flat", "node_limited")


def node_remote_copies(*, top_k: int, topk_group: int, nodes: int) -> float:
    """Under node-limited dispatch, the copies of one token that cross nodes: its experts lie on at most
    ``min(top_k, topk_group, nodes)`` nodes (DeepSeek-V3: 4 of 8 groups, one group per node), each reached once,
    and under balanced routing each is another node than the token's with probability ``(nodes - 1) / nodes``."""
    return min(top_k, topk_group, nodes) * (nodes - 1) / nodes


def node_limited_dispatch_s(c: Candidate, model: ModelShape, hardware: HardwareSpec, row_bytes: float) -> float:
    """One all-to-all of DeepSeek-V3's dispatch (report section 3.2.2) for a rank's tokens of ``row_bytes`` each:
    ``node_remote_copies`` per token over the inter-node link, and every one of its k rows forwarded over the
    intra-node link to its expert (the two overlap: the slower one counts). Its groups are taken as its nodes."""
    per_node = max(1, min(c.ep, hardware.devices_per_node // ep_stride(c)))
    nodes = -(-c.ep // per_node)
    groups = model.topk_group if model.n_group > 1 else model.top_k
    remote = node_remote_copies(top_k=model.top_k, topk_group=groups, nodes=nodes)
    inter = remote * row_bytes / hardware.inter.bytes_per_s + (nodes - 1) * hardware.inter.latency_s
    intra = all_to_all_s(model.top_k * row_bytes, n=per_node, link=hardware.intra)
    return max(inter, intra)


def ep_stride(c: Candidate) -> int:
    """Ranks between neighbours of an ep group: ep is the inner factor of its lenders (dp x cp) flattened in mesh
    order (``parallel/foundation/meshes.py`` ``expert_meshes``), so its stride is the innermost lender's (t)."""
    return c.stride(lenders("ep")[-1])


def cp_all_to_alls_per_layer(*, recompute: str = "none") -> int:
    """Ulysses' all-to-alls of one block per micro-batch: q, k, v in and the output back forward, the same four
    in backward; full recomputation repeats the forward's four (``parallel/techniques/cp.py``)."""
    return 8 + (4 if recompute == "full" else 0)


def ep_all_to_alls_per_layer(*, recompute: str = "none") -> int:
    """Expert parallel's all-to-alls of the routed rows in one MoE block per micro-batch (``parallel/techniques/ep.py``):
    dispatch and combine forward, their reverse exchanges in backward; a recomputed forward (full, and selective,
    whose op-level policy saves matmul outputs only) sends its two again. Each forward dispatch also exchanges the
    E row counts first (``ep_counts_exchanges_per_layer``)."""
    return 4 + (2 if recompute in ("full", "selective") else 0)


def ep_counts_exchanges_per_layer(*, recompute: str = "none") -> int:
    """The small all-to-all of the per-expert row counts before each forward dispatch (uneven splits)."""
    return 1 + (1 if recompute in ("full", "selective") else 0)


def ring_allreduce_s(nbytes: float, *, n: int, link: Link, messages: int = 1) -> float:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the buffer (reduce-scatter + all-gather)
    in 2(n-1) steps, each paying the link latency (Patarasuk & Yuan 2009; the cost Megatron-LM
    arXiv 2104.04473 section 3 uses for its data- and tensor-parallel all-reduces)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bytes_per_s + 2 * (n - 1) * link.latency_s * messages


def muon_gather_s(m: MuonCost) -> float:
    """``optim=muon``'s gathers: spread, two all-to-all-like exchanges of a rank's parts over the matrix's mesh (to
    the owners, and back); everywhere, an all-gather of every matrix (half a ring all-reduce)."""
    if m.link is None or m.mesh <= 1:
        return 0.0
    if m.spread:
        return all_to_all_s(m.out_bytes, n=m.mesh, link=m.link) + all_to_all_s(m.back_bytes, n=m.mesh, link=m.link)
    return ring_allreduce_s(m.out_bytes, n=m.mesh, link=m.link) / 2


def tp_collectives_per_layer(
    model: ModelShape, *, meshtrain: bool, recompute: str = "none", sparse: bool = False
) -> int:
    """Tensor-parallel all-reduces of one block per micro-batch. Megatron-LM (arXiv 2104.04473 section 3.2):
    2 forward (attention and MLP outputs) + 2 backward (their inputs' gradients, one fused f operator each).
    meshtrain's DTensor plan all-reduces the input gradient of every column-wise projection on its own: wq,
    wk, wv and the MLP's input projections (w1; w1 and w3 when gated): 2 + 4 = 6 for the GPT, 7 for Llama
    (the ``tp_collectives`` a tp run reports). Full recomputation repeats the forward's 2. A ``sparse`` block in
    meshtrain runs its mixture of experts whole on every tp rank: the attention's 1 + 3 only (its collectives
    under sequence parallel are not counted)."""
    if sparse and meshtrain:
        return 1 + 3 + (1 if recompute == "full" else 0)
    backward = (3 + (2 if model.gated_mlp else 1)) if meshtrain else 2
    return 2 + backward + (2 if recompute == "full" else 0)


#: meshtrain's vocabulary-parallel head: all-gather of the logits forward, input-gradient all-reduce backward
TP_HEAD_COLLECTIVES = 2


def p2p_s(nbytes: float, *, link: Link) -> float:
    """One point-to-point message: latency + bytes / bandwidth."""
    return link.latency_s + nbytes / link.bytes_per_s


# ---- the estimate -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Placement:
    """Where a pipeline's blocks sit, a function of the model and of (pp, v, schedule, split points) alone, so it is
    computed once per model for all the candidates that share them: each rank's blocks (the MTP modules on the last
    stage's rank), the rank holding the last stage, and the kinds of rank for the memory terms: (its kinds of blocks,
    or with LoRA, whose targets may name blocks, the blocks themselves; first; last), each rank's kind (an index)."""

    layers_of: tuple[tuple[int, ...], ...]
    last: int
    kinds: tuple[tuple, ...]
    """The distinct kinds, in the order of the first rank of each (``kind_rank``)."""
    kind_rank: tuple[int, ...]
    kind_of: tuple[int, ...]

    @classmethod
    def of(cls, c: Candidate, model: ModelShape) -> _Placement:
        v = c.stages_per_rank if c.pp > 1 else 1
        return model.remember(("placement", c.pp, v, c.schedule, c.split_points), lambda: cls._computed(c, model, v))

    @classmethod
    def _computed(cls, c: Candidate, model: ModelShape, v: int) -> _Placement:
        last = last_chunk_rank(pp=c.pp, schedule=c.schedule, stages_per_rank=v)
        layers_of = rank_layers(
            model.n_layers, pp=c.pp, stages_per_rank=v, schedule=c.schedule, split_points=c.split_points
        )
        layers_of[last] = [*layers_of[last], *model.mtp_layers]  # the MTP modules sit on the last stage
        index: dict[tuple, int] = {}
        kind_of = []
        for r, layers in enumerate(layers_of):
            kind = (tuple(layers) if model.lora_rank > 0 else model.block_kinds(layers), r == 0, r == last)
            kind_of.append(index.setdefault(kind, len(index)))
        kind_rank = tuple(kind_of.index(k) for k in range(len(index)))
        return cls(tuple(tuple(layers) for layers in layers_of), last, tuple(index), kind_rank, tuple(kind_of))


@dataclass(slots=True)
class _Split:
    """How a candidate cuts the workload, read by every term: tokens per sample on a rank (``s``; ``s_full``
    unsplit), virtual stages per rank, activation bytes per element, samples per micro-batch, the ranks that see
    different tokens (dp x cp), each pipeline rank's layers and the rank holding the last one (``placement``)."""

    s_full: int
    s: float
    v: int
    e: int
    b: float
    data: int
    placement: _Placement
    meshtrain: bool
    reference: int = 0
    """Forwards of a reference held on the ranks per micro-batch (``Workload.reference_copy``): 0 or 1."""

    @property
    def layers_of(self) -> tuple[tuple[int, ...], ...]:
        return self.placement.layers_of

    @property
    def last(self) -> int:
        return self.placement.last

    @classmethod
    def of(cls, c: Candidate, model: ModelShape, workload: Workload) -> _Split:
        return cls(
            s_full=workload.seq_len,
            s=workload.seq_len / c.cp,  # context parallel splits the sequence
            v=c.stages_per_rank if c.pp > 1 else 1,
            e=workload.activation_bytes,
            b=workload.global_batch_size / (c.dp * c.micro_batches),
            data=c.dp * c.cp,  # FSDP shards and gradients reduce over dp x cp
            placement=_Placement.of(c, model),
            meshtrain=workload.meshtrain,
            reference=int(workload.reference_copy),
        )


def _rank_states(
    c: Candidate, model: ModelShape, workload: Workload, layers: tuple[int, ...], *, first: bool, last: bool
) -> Memory:
    """A pipeline rank's states (weights, gradients, optimizer, a held reference; its activations left at 0): what its
    blocks and its ends of the model (embedding, head) hold, for ``c``'s degrees and ZeRO stage (all it reads)."""
    meshtrain = workload.meshtrain
    params = rank_params(model, layers, first=first, last=last, tp=c.tp, meshtrain=meshtrain)
    w, g, o = rank_state_bytes(model, layers, params=params, c=c, workload=workload, meshtrain=meshtrain)
    if model.lora_rank > 0:  # frozen weights held in full; the adapters alone have gradients and states
        trainable = rank_trainable_params(model, layers, last=last, tp=c.tp, meshtrain=meshtrain)
        adapters, g, o = model_state_bytes(
            trainable, bytes_per_param=workload.bytes_per_param, zero_stage=c.zero_stage, dp=c.dp * c.cp
        )
        w += adapters
    reference = w if workload.reference_copy and model.lora_rank == 0 else 0.0  # LoRA: the base, adapters off
    return Memory(params=w, grads=g, optimizer=o, activations=0.0, reference=reference)


def _rank_saved_bytes(
    model: ModelShape, workload: Workload, case: ActivationCase, layers: tuple[int, ...], *, v: int, last: bool
) -> float:
    """A pipeline rank's saved activation bytes per micro-batch: its blocks' (``case``: the micro-batch's shape,
    tp, sequence parallel, recomputation), its stages' rotary tables and, on the last rank, the loss's."""
    meshtrain = workload.meshtrain
    layer_bytes = saved_layer_activation_bytes if meshtrain else layer_activation_bytes
    per_mb = sum(
        n * model.remember((layer_bytes, i, case), lambda i=i: layer_bytes(model, i, case))
        for i, n in model.layer_groups(layers)
    )
    if meshtrain and layers and model.block_saved_bytes is None:  # each of the rank's stages keeps its own table
        per_mb += v * rotary_table_saved_bytes(model, seq_len=workload.seq_len)
    if last:  # the loss's, once for the main head and once per MTP module
        per_mb += (1 + model.mtp_depth) * (
            head_saved_bytes(model, case)
            if meshtrain
            else logits_bytes(
                model, seq_len=case.seq_len, micro_batch=case.micro_batch, tp=case.tp, element_bytes=case.element_bytes
            )
        )
    return per_mb


def _kind_memories(c: Candidate, model: ModelShape, workload: Workload, sp: _Split) -> list[tuple[Memory, float]]:
    """Each kind of pipeline rank's states (activations left at 0) and saved activation bytes per micro-batch, in
    ``_Placement.kinds`` order. Ranks of one kind (the same kinds of blocks and ends of the model) hold the same
    states and per-micro-batch activations, and the planner asks this for tens of thousands of candidates that share
    most of them: the states are remembered per model, workload, degrees and ZeRO stage, the activations per model,
    workload, ``ActivationCase`` and virtual stages, each per kind of rank."""
    memo = model.remember(("rank_memories", workload), dict)
    degrees = ("states", tuple(c.sizes.items()), c.zero_stage)
    case = ActivationCase(
        seq_len=sp.s,
        micro_batch=sp.b,
        tp=c.tp,
        sequence_parallel=c.sequence_parallel,
        recompute=c.recompute,
        element_bytes=sp.e,
        cp=c.cp,
        ep=c.ep,
    )
    placement = sp.placement
    per_kind = []
    for kind, r in zip(placement.kinds, placement.kind_rank, strict=True):
        layers, first, last = placement.layers_of[r], kind[1], kind[2]
        states_key, saved_key = (*degrees, kind), ("saved", case, sp.v, kind)
        states = memo.get(states_key)
        if states is None:
            states_of = Candidate(sizes=dict(c.sizes), zero_stage=c.zero_stage)
            states = memo[states_key] = _rank_states(states_of, model, workload, layers, first=first, last=last)
        saved = memo.get(saved_key)
        if saved is None:
            saved = memo[saved_key] = _rank_saved_bytes(model, workload, case, layers, v=sp.v, last=last)
        per_kind.append((states, saved))
    return per_kind


def _rank_memories(c: Candidate, model: ModelShape, workload: Workload, sp: _Split) -> list[tuple[Memory, float]]:
    """Each pipeline rank's memory (its kind's states, and the activations its micro-batches in flight hold) and its
    saved activation bytes per micro-batch (``_kind_memories``)."""
    per_kind = _kind_memories(c, model, workload, sp)
    out = []
    held = _in_flight(c.schedule, pp=c.pp, m=c.micro_batches, v=sp.v)
    for k, in_flight in zip(sp.placement.kind_of, held, strict=True):
        states, per_mb = per_kind[k]
        out.append(
            (Memory(states.params, states.grads, states.optimizer, per_mb * in_flight, states.reference), per_mb)
        )
    return out


@functools.lru_cache(maxsize=4096)
def _in_flight(schedule: str, *, pp: int, m: int, v: int) -> tuple[float, ...]:
    """``micro_batches_in_flight`` of each pipeline rank (a function of the schedule alone)."""
    return tuple(micro_batches_in_flight(schedule, pp=pp, m=m, v=v, stage=r) for r in range(pp))


def memory_budget(hardware: HardwareSpec, workload: Workload) -> float:
    """Bytes a rank may use: the device's memory times ``planner.memory_fraction``."""
    return hardware.memory_bytes * workload.memory_fraction


def peak_memory(candidate: Candidate, *, model: ModelShape, workload: Workload) -> float:
    """The fullest pipeline rank's bytes, ``estimate(...).memory.total`` to the last bit, without the step's time or
    a ``Memory`` per rank: the search decides on memory first and times only the candidates within the budget. A
    rank's total grows with its micro-batches in flight, so each kind of rank's fullest is the one holding the most
    (``_most_in_flight``), summed in ``Memory.total``'s order."""
    c = candidate
    sp = _Split.of(c, model, workload)
    key = ("most_in_flight", c.pp, sp.v, c.schedule, c.split_points, c.micro_batches)
    most = model.remember(key, lambda: _most_in_flight(sp.placement, c.schedule, pp=c.pp, m=c.micro_batches, v=sp.v))
    return max(
        states.params + states.grads + states.optimizer + per_mb * held + states.reference
        for (states, per_mb), held in zip(_kind_memories(c, model, workload, sp), most, strict=True)
    )


def _most_in_flight(placement: _Placement, schedule: str, *, pp: int, m: int, v: int) -> tuple[float, ...]:
    """The most micro-batches in flight on a rank of each of ``placement``'s kinds."""
    most = [0.0] * len(placement.kinds)
    for k, held in zip(placement.kind_of, _in_flight(schedule, pp=pp, m=m, v=v), strict=True):
        most[k] = max(most[k], held)
    return tuple(most)


@dataclass(frozen=True)
class _LinkCosts:
    """Each dimension's communication per layer of one micro-batch: the tp collective, cp's all-to-alls, ep's."""

    tp_calls_per_layer: dict[bool, int]
    """tp collectives of a dense (False) or sparse (True) block."""
    tp_collective: float
    cp_per_layer: float
    ep_per_layer: float

    @classmethod
    def of(cls, c: Candidate, model: ModelShape, hardware: HardwareSpec, sp: _Split) -> _LinkCosts:
        tokens, e = sp.b * sp.s, sp.e
        ar_of = model.remember(  # per block: dense or sparse
            ("tp_calls_per_layer", sp.meshtrain, c.recompute),
            lambda: {
                sparse: tp_collectives_per_layer(model, meshtrain=sp.meshtrain, recompute=c.recompute, sparse=sparse)
                for sparse in (False, True)
            },
        )
        tp_ar = 0.0  # each dimension's term is read only where its degree is above 1 (``_stages``)
        if c.tp > 1:
            tp_link = hardware.link_for(span=c.tp, stride=c.stride("tp"))
            tp_ar = ring_allreduce_s(tokens * model.d_model * e, n=c.tp, link=tp_link) + hardware.tp_collective_s
        cp = _cp_per_layer(c, model, hardware, tokens, e) if c.cp > 1 else 0.0
        ep = _ep_per_layer(c, model, hardware, tokens, e) if c.ep > 1 else 0.0
        return cls(ar_of, tp_ar, cp, ep)


def _cp_per_layer(c: Candidate, model: ModelShape, hardware: HardwareSpec, tokens: float, e: int) -> float:
    """Ulysses: each all-to-all moves one of q, k, v or the output, this rank's b·s/c tokens x h/t channels."""
    cp_link = hardware.link_for(span=c.cp, stride=c.stride("cp"))
    cp_a2a = all_to_all_s(tokens * model.q_dim / c.tp * e, n=c.cp, link=cp_link)
    return cp_all_to_alls_per_layer(recompute=c.recompute) * cp_a2a


def _ep_per_layer(c: Candidate, model: ModelShape, hardware: HardwareSpec, tokens: float, e: int) -> float:
    """Expert parallel: each all-to-all moves this rank's T·k routed rows of h channels among the ep ranks of its
    group (balanced routing), on the link the ep group spans (``node_limited_dispatch_s`` for DeepSeek-V3's
    dispatch across nodes); the row counts go first (E int64 values)."""
    ep_link = hardware.link_for(span=c.ep, stride=ep_stride(c))
    if c.dispatch == "node_limited" and hardware.crosses_nodes(span=c.ep, stride=ep_stride(c)):
        ep_rows = node_limited_dispatch_s(c, model, hardware, tokens * model.d_model * e)
    else:
        ep_rows = all_to_all_s(tokens * model.top_k * model.d_model * e, n=c.ep, link=ep_link)
    ep_counts = all_to_all_s(model.n_experts * 8, n=c.ep, link=ep_link)
    ep_per_layer = ep_all_to_alls_per_layer(recompute=c.recompute) * ep_rows
    ep_per_layer += ep_counts_exchanges_per_layer(recompute=c.recompute) * ep_counts
    return ep_per_layer


@dataclass(frozen=True)
class _Stages:
    """Each pipeline rank's time per micro-batch, by term, and the step's pipeline from the slowest."""

    compute: list[float]
    tp: list[float]
    tp_calls: list[float]
    cp: list[float]
    ep: list[float]
    pp_per_mb: float
    times: tuple[float, ...]
    bubble: float
    pipeline_s: float
    scale: float
    bottleneck: int


def _stage_compute(
    c: Candidate, model: ModelShape, hardware: HardwareSpec, sp: _Split, r: int, layers: list[int], busy: float
) -> float:
    """Pipeline rank ``r``'s forward and backward of one micro-batch (and a held reference's forward); attention spans
    the whole sequence (4·s·h per token, s the full length)."""
    key = ("stage_flops", tuple(layers), r == 0, r == sp.last, c.recompute, sp.s_full, sp.reference, sp.meshtrain)
    flops, whole, share = model.remember(key, lambda: _stage_flops(model, sp, layers, c.recompute, r))
    rank_flops = (flops - whole) / c.tp + whole
    tokens = sp.b * sp.s
    return (rank_flops * tokens / hardware.flops + hardware.microbatch_overhead_s * share) * busy


def _stage_flops(model: ModelShape, sp: _Split, layers: list[int], recompute: str, r: int) -> tuple[float, ...]:
    """(FLOPs per token of rank ``r``'s micro-batch, those of its mixtures of experts, its share of the fixed
    overhead): a function of its blocks, its ends of the model and the recomputation alone, shared by every
    candidate placing the same blocks there."""
    passes = {"none": 3.0, "selective": 3.0, "full": 4.0}[recompute] + sp.reference  # a held reference's forward
    groups = model.layer_groups(layers)
    flops = sum(n * passes * model.layer_forward_flops_per_token(i, sp.s_full) for i, n in groups)
    if recompute == "selective":
        flops += 4 * sp.s_full * model.d_model * len(layers)
    if r == sp.last:
        flops += (3 + sp.reference) * model.logit_forward_flops_per_token()
    # meshtrain runs a mixture of experts whole on every tp rank: its FLOPs are not divided by t
    whole = sum(n * passes * 2 * model.layer_moe_active_params(i) for i, n in groups) if sp.meshtrain else 0.0
    share = (len(layers) + (r == 0) + (r == sp.last)) / (model.n_layers + 2)
    return flops, whole, share


def _pp_per_micro_batch(c: Candidate, model: ModelShape, hardware: HardwareSpec, sp: _Split) -> float:
    """The pipeline's sends per micro-batch (each virtual stage boundary: forward, then back) and its actions."""
    if c.pp <= 1:
        return 0.0
    pp_link = hardware.link_for(span=c.pp, stride=c.stride("pp"))
    if pp_link is hardware.intra:
        pp_link = hardware.p2p
    act_msg = sp.b * sp.s * model.d_model * sp.e / (c.tp if c.sequence_parallel else 1)
    hops = schedule_spec(c.schedule).p2p_round_trips * sp.v
    pp_per_mb = 2 * hops * p2p_s(act_msg, link=pp_link)
    # every stage of a rank runs F and B (and W where the schedule splits the backward) per micro-batch
    return pp_per_mb + actions_per_micro_batch(c.schedule, v=sp.v) * hardware.pipeline_action_s


def _stages(c: Candidate, model: ModelShape, hardware: HardwareSpec, sp: _Split, busy: float) -> _Stages:
    """Time of one micro-batch on each pipeline rank (forward + backward, and each dimension's communication),
    then the step's pipeline: m micro-batches of the slowest rank, stretched by the schedule's bubble."""
    links = _LinkCosts.of(c, model, hardware, sp)
    compute, tp, tp_calls, cp, ep = [], [], [], [], []
    placement = sp.placement
    for r in placement.kind_rank:  # ranks of one kind (``_Placement``) take the same time: one of each
        layers = placement.layers_of[r]
        groups = model.layer_groups(layers)
        compute.append(_stage_compute(c, model, hardware, sp, r, layers, busy))
        head = TP_HEAD_COLLECTIVES if sp.meshtrain and r == sp.last else 0
        tp_calls.append(sum(n * links.tp_calls_per_layer[model.sparse[i]] for i, n in groups) + head if c.tp > 1 else 0)
        tp.append(tp_calls[-1] * links.tp_collective)
        cp.append(len(layers) * links.cp_per_layer if c.cp > 1 else 0.0)
        ep.append(sum(n for i, n in groups if model.sparse[i]) * links.ep_per_layer if c.ep > 1 else 0.0)
    compute, tp, tp_calls, cp, ep = ([term[k] for k in placement.kind_of] for term in (compute, tp, tp_calls, cp, ep))
    pp_per_mb = _pp_per_micro_batch(c, model, hardware, sp)
    times = tuple(comp + tp_ + cp_ + ep_ + pp_per_mb for comp, tp_, cp_, ep_ in zip(compute, tp, cp, ep, strict=True))
    bubble = bubble_fraction(c.schedule, pp=c.pp, m=c.micro_batches, v=sp.v)
    pipeline_s = c.micro_batches * max(times) / (1 - bubble)
    scale = pipeline_s / (c.micro_batches * max(times)) if max(times) > 0 else 1.0
    bottleneck = max(range(len(times)), key=lambda r: times[r])
    return _Stages(compute, tp, tp_calls, cp, ep, pp_per_mb, times, bubble, pipeline_s, scale, bottleneck)


def _dp_comm(
    c: Candidate,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    sp: _Split,
    worst: Memory,
    worst_layers: list[int],
    compute_s: float,
    fixed_calls: dict[str, float],
) -> float:
    """Once per step: the data-parallel gradient reduction (over dp x cp; a rank's experts over their own mesh),
    its share hidden behind the backward, and DDP's or FSDP2's fixed costs per call (counted into ``fixed_calls``).

    Under expert parallel a rank's experts (1/ep of each layer's) are gathered and reduced over their own mesh,
    the n·c/ep ranks holding the same experts (ep x the ep stride apart), the rest over n·c as without."""
    data = sp.data
    expert_local = 0.0  # this rank's whole expert gradients (its 1/ep) before they are reduce-scattered
    if c.ep > 1 and model.lora_rank <= 0:
        experts = rank_expert_params(model, worst_layers, tp=c.tp, meshtrain=sp.meshtrain)
        expert_local = experts / c.ep * workload.bytes_per_param[1]
    expert_held = expert_local / (data // c.ep) if c.zero_stage >= 2 else expert_local
    dense_local = (worst.grads - expert_held) * (data if c.zero_stage >= 2 else 1)
    grad_bytes = dense_local + expert_local  # full local gradient before reduce-scatter
    gathered = 1.5 if c.zero_stage >= 3 else 1.0  # ZeRO section 7: P_os+g+p moves 3Ψ vs 2Ψ
    volume = dense_local * gathered
    if c.zero_stage >= 3 and model.lora_rank > 0:
        # frozen weights are still all-gathered (forward and backward: Ψ in all-reduce units) and only the
        # adapters' gradients reduce-scattered (half an all-reduce)
        volume = 0.5 * grad_bytes + worst.params * data
    # the gradient reduction spans dp x cp (cp inside dp in the mesh: its stride is the group's innermost)
    dp_link = hardware.link_for(span=data, stride=c.stride("cp" if c.cp > 1 else "dp"))
    buckets = ddp_buckets(grad_bytes)
    dp_total = ring_allreduce_s(volume, n=data, link=dp_link, messages=buckets)
    expert_link = hardware.link_for(span=data // c.ep, stride=c.ep * ep_stride(c))
    dp_total += ring_allreduce_s(expert_local * gathered, n=data // c.ep, link=expert_link)
    # bucketed all-reduce overlaps the backward pass (PyTorch DDP, Li et al., VLDB 2020): it hides at most
    # dp_comm_overlap of itself, and never more than the step's backward compute (2/3 of the compute)
    hidden = min(hardware.dp_comm_overlap * dp_total, (2 / 3) * compute_s)
    dp_comm_s = dp_total - hidden
    if c.zero_stage == 0 and data > 1:
        # DDP's reducer, per bucket: autograd hooks, copies into and out of the bucket, and the all-reduce's
        # exposed wait while gloo's thread competes with the node's compute (measured on a whole DDP step)
        fixed_calls["ddp_bucket_s"] = buckets
        dp_comm_s += buckets * hardware.ddp_bucket_s
    if c.zero_stage >= 3 and data > 1:
        # FSDP2 units (each block, and the root): all-gather for forward and again for backward on every
        # micro-batch, reduce-scatter once per step (meshtrain skips it on the others); each pays a fixed cost
        # expert parallel: each MoE block's experts are a unit of their own (on the experts' mesh)
        units = max(len(ls) + (sum(model.sparse[i] for i in ls) if c.ep > 1 else 0) for ls in sp.layers_of) + 1
        fixed_calls["fsdp_collective_s"] = units * (2 * c.micro_batches + 1)
        dp_comm_s += fixed_calls["fsdp_collective_s"] * hardware.fsdp_collective_s
    return dp_comm_s


def _cpu_floor(
    c: Candidate, hardware: HardwareSpec, st: _Stages, optimizer_s: float, fixed_calls: dict, step: float, on_node: int
) -> tuple[float, float]:
    """(the node's CPU work per rank, the factor the step stretches by). CPU ranks beyond the node's cores
    time-share them: the step takes at least the node's CPU work (each rank's micro-batches, its AdamW, and the
    share of its fixed costs that calibration measured as CPU time) spread over its cores. Not the step itself times
    ranks per core: a rank waiting in a collective or a pipeline bubble sleeps and leaves its core to the others; on
    the 2-core machine 4-rank hybrids measured 0.17-0.32 s, where scaling their whole step by 2 x (1 - bubble)
    predicted 1.5-1.6x that (docs/planner.md, "Ranks beyond the cores")."""
    work = c.micro_batches * sum(st.compute) / len(st.compute) + optimizer_s
    work += sum(
        n * getattr(hardware, name) * hardware.fixed_cost_cpu_share.get(name, 0.0) for name, n in fixed_calls.items()
    )
    t = 1.0
    if hardware.cores_per_node and step > 0:
        t = max(1.0, on_node * hardware.threads_per_device * work / hardware.cores_per_node / step)
    return work, t


def elementwise_optimizer_s(
    c: Candidate,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    worst: Memory,
    layers: list[int],
    *,
    meshtrain: bool,
) -> float:
    """The optimizer's elementwise pass over the parameters whose states the fullest rank updates, at memory
    bandwidth: read w, g, K and write w, K (K: its states' bytes); clipping reads g. AdamW's K for every parameter,
    except under ``optim=muon`` the blocks' matrices, which move one momentum buffer (``muon_bytes_per_param``);
    their Newton-Schulz matmuls are timed apart, as FLOPs (``muon_step_cost``)."""
    w, g, k = workload.bytes_per_param
    k_muon = workload.muon_bytes_per_param[2]
    muon = rank_muon_state_params(model, layers, c=c, workload=workload, meshtrain=meshtrain)
    adamw = (worst.optimizer - muon * k_muon) / k
    moved = adamw * (2 * w + 2 * g + 2 * k) + muon * (2 * w + 2 * g + 2 * k_muon)
    return moved / hardware.memory_bytes_per_s


def estimate(
    candidate: Candidate,
    *,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
) -> Estimate:
    """Memory of the fullest rank and time of one optimizer step for ``candidate``, term by term: each pipeline
    rank's memory, each rank's micro-batch (compute and each dimension's communication) and the pipeline over them,
    the gradient reduction, the optimizer, and the CPU floor."""
    c = candidate
    sp = _Split.of(c, model, workload)
    ranks = _rank_memories(c, model, workload, sp)
    rank_memory = [mem for mem, _ in ranks]
    worst = max(rank_memory, key=lambda m: m.total)  # the first of the fullest
    # ranks sharing a node slow each other down (memory bandwidth, caches): measured, see calibrate.py
    on_node = min(c.world_size, hardware.devices_per_node)
    st = _stages(c, model, hardware, sp, hardware.busy_node_slowdown if on_node > 1 else 1.0)
    m, scale, bottleneck = c.micro_batches, st.scale, st.bottleneck
    compute_s = m * st.compute[bottleneck] * scale
    # each fixed cost's calls on a mean rank per step (the floor counts their CPU share)
    fixed_calls = {
        "tp_collective_s": m * sum(st.tp_calls) / len(st.tp_calls),
        "pipeline_action_s": m * actions_per_micro_batch(c.schedule, v=sp.v) if c.pp > 1 else 0,
    }
    worst_layers = sp.layers_of[rank_memory.index(worst)]
    dp_comm_s = _dp_comm(c, model, hardware, workload, sp, worst, worst_layers, compute_s, fixed_calls)
    optimizer_s = elementwise_optimizer_s(c, model, hardware, workload, worst, worst_layers, meshtrain=sp.meshtrain)
    muon = muon_step_cost(model, worst_layers, c=c, hardware=hardware, workload=workload)
    muon_used = workload.optimizer == "muon"  # AdamW's is all zeros (``MuonCost()``): nothing to add or scale
    if muon_used:
        muon = replace(muon, gather_s=muon_gather_s(muon))
        optimizer_s += muon.ns_s + muon.gather_s  # optim=muon: the rank's orthogonalisations and their gathers
    budget = memory_budget(hardware, workload)
    step = st.pipeline_s + dp_comm_s + optimizer_s
    work, t = _cpu_floor(c, hardware, st, optimizer_s, fixed_calls, step, on_node)
    return Estimate(
        candidate=c,
        memory=worst,
        step_time_s=step * t,
        compute_s=compute_s * t,
        bubble_fraction=st.bubble,
        tp_comm_s=m * st.tp[bottleneck] * scale * t,
        cp_comm_s=m * st.cp[bottleneck] * scale * t,
        ep_comm_s=m * st.ep[bottleneck] * scale * t,
        pp_comm_s=m * st.pp_per_mb * scale * t,
        dp_comm_s=dp_comm_s * t,
        optimizer_s=optimizer_s * t,
        stage_times_s=tuple(x * t for x in st.times),
        fits=worst.total <= budget,
        budget_bytes=budget,
        rank_memory=tuple(rank_memory),
        rank_activation_per_micro_batch=tuple(pm for _, pm in ranks),
        rank_work_s=work,
        muon=replace(muon, ns_s=muon.ns_s * t, gather_s=muon.gather_s * t) if muon_used else muon,
    )


# ---- what the further dimensions ask of the planner: where they split a model, why they were chosen --------------


def splits_model(sizes: dict[str, int], *, model: ModelShape, workload: Workload) -> bool:
    """Whether the layout's degrees split this model: a dimension the planner does not vary for it (``planned_dims``)
    stays at 1; ep whole experts per rank; cp a family with context-parallel attention, whole heads of each tp rank
    and equal chunks of the sequence (Ulysses)."""
    planned = planned_dims(model)
    if any(size > 1 for name, size in sizes.items() if name not in planned):
        return False
    tp, cp, ep = sizes["tp"], sizes.get("cp", 1), sizes.get("ep", 1)
    if ep > 1 and model.n_experts % ep:
        return False
    return cp == 1 or bool(model.context_parallel and not (model.n_heads // tp) % cp and not workload.seq_len % cp)


def planned_dims(model: ModelShape) -> tuple[str, ...]:
    """The degrees the planner varies for this model (its table's columns): the multiplying dimensions, and ep
    for a mixture of experts."""
    return (*multiplying(), *(("ep",) if model.n_experts else ()))


def dimension_reasons(
    best: Estimate,
    ranked: tuple[Estimate, ...],
    *,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    describe: Callable[[Candidate], str],
) -> list[str]:
    """The plan's reason for its further dimensions, in this model's numbers (ep's for a mixture of experts)."""
    if not model.n_experts:
        return []
    return [expert_reason(best, ranked, model=model, hardware=hardware, workload=workload, describe=describe)]


def dimension_pitfalls(
    c: Candidate, est: Estimate, *, model: ModelShape, hardware: HardwareSpec, workload: Workload
) -> list[str]:
    """The further dimensions' traps for one layout: expert parallel's classic rule, keep ep inside a node (its
    all-to-alls over the inter-node links)."""
    out: list[str] = []
    if c.ep > 1 and hardware.crosses_nodes(span=c.ep, stride=ep_stride(c)):
        inside = [
            d
            for d in range(c.ep - 1, 0, -1)
            if model.n_experts % d == 0 and c.data_size % d == 0 and d * ep_stride(c) <= hardware.devices_per_node
        ]
        spanned = min(hardware.nnodes, -(-c.ep * ep_stride(c) // hardware.devices_per_node))
        line = (
            f"ep.size={c.ep} spans {spanned} nodes over {hardware.inter.gbps:g} Gbit/s links per device "
            f"(topology.inter_node_gbps): the routed tokens' all-to-alls take {est.ep_comm_s:.3g} s of a predicted "
            f"{est.step_time_s:.3g} s step"
        )
        if inside:
            alt = estimate(with_ep(c, inside[0]), model=model, hardware=hardware, workload=workload)
            line += f" ({alt.ep_comm_s:.3g} s of {alt.step_time_s:.3g} s at ep.size={inside[0]} inside a node)"
        out.append(
            line + f"; keep ep inside a node (ep.size x tp.size <= {hardware.devices_per_node}: its group is ep "
            "neighbouring ranks of dp x cp, tp apart)"
        )
    return out


def with_ep(c: Candidate, ep: int) -> Candidate:
    """``c`` with expert-parallel degree ``ep`` (everything else kept)."""
    return replace(c, sizes={**c.sizes, "ep": ep})


def expert_reason(
    best: Estimate,
    ranked: tuple[Estimate, ...],
    *,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    describe: Callable[[Candidate], str],
) -> str:
    """Why the first choice of a mixture of experts has its ep degree, in the cost model's numbers: under ZeRO-3 an
    expert costs the same memory at any ep (its states are sharded over every data-parallel rank either way), but
    with ep each rank all-gathers and reduce-scatters only its n_experts / ep experts per layer, over the ep-fewer
    ranks that hold them, for the all-to-alls of the routed tokens."""
    c = best.candidate
    experts = sum(model.layer_expert_params(i) for i in range(model.n_layers))
    what = (
        f"mixture of experts ({experts / model.params:.0%} of the {count_text(model.params)} parameters in "
        f"{model.n_experts} routed experts per sparse layer, {model.top_k} per token)"
    )
    if c.ep == 1:
        alt = next((e for e in ranked if e.candidate.ep > 1), None)
        return f"{what}: ep=1" + (
            f" (the best layout with ep, {describe(alt.candidate)}, is {alt.step_time_s / best.step_time_s:.2f}x slower)"
            if alt is not None
            else ""
        )
    inside = "inside a node" if not hardware.crosses_nodes(span=c.ep, stride=ep_stride(c)) else "across nodes"
    flat = estimate(with_ep(c, 1), model=model, hardware=hardware, workload=workload)
    out = (
        f"{what} → ep={c.ep} ({inside}): each rank gathers and reduces {model.n_experts // c.ep} of each layer's "
        f"{model.n_experts} experts, data-parallel time {best.dp_comm_s:.3g} s against {flat.dp_comm_s:.3g} s at ep=1 in "
        f"the same layout ({flat.step_time_s:.3g} s/step), for {best.ep_comm_s:.3g} s of all-to-alls"
    )
    without = next((e for e in ranked if e.candidate.ep == 1), None)
    if without is not None:
        out += (
            f"; {without.step_time_s / best.step_time_s:.2f}x faster than the best layout without ep "
            f"({describe(without.candidate)})"
        )
    return out
