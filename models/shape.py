"""Parameter and FLOP formulas of a decoder-only transformer, from its shape alone. No torch import.

A ``ModelShape`` is what the planner, validation's memory check and a run's MFU need to know about a
model: its parameter count (per block, embeddings, head) and its training FLOPs per token. Each model
family's ``ModelSpec`` (``models/spec.py``) builds one from the family's config (``ModelSpec.shape``), so
the formulas are written once here and the family says only how its config maps onto them:

- GPT (``models/gpt``): learned positions, LayerNorm (weight + bias), a 2-matrix GELU MLP, full
  multi-head attention;
- Llama (``models/llama``): rotary positions (no position table), RMSNorm (weight only), a 3-matrix
  SwiGLU MLP, grouped-query attention (``n_kv_heads`` key/value heads shared by the query heads);
- a mixture of experts (``models/qwen3_moe``): in the layers marked ``sparse`` the MLP is ``n_experts`` SwiGLU
  experts of width ``moe_d_ff`` (plus ``n_shared_experts`` every token runs) and a router; ``params`` counts every
  expert (memory), ``active_params`` and the FLOPs only the ``top_k`` a token runs through.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def targeted(fqn: str, targets: Iterable[str]) -> bool:
    """A module FQN matches a LoRA target (``model.lora.targets``) by its last name (``wq``) or as an ``fnmatch``
    pattern over the whole FQN (``layers.*.attention.wq``)."""
    last = fqn.rsplit(".", 1)[-1]
    return any(t == last or fnmatch.fnmatchcase(fqn, t) for t in targets)


def kv_repeats(kv_heads: int, cp: int) -> int:
    """How many times context parallel repeats each key/value head so that cp ranks get whole heads
    (``parallel/techniques/cp.py``): 1 when cp divides them, else lcm(kv_heads, cp) / kv_heads (a query head's
    group still maps to copies of its own key/value head)."""
    return math.lcm(kv_heads, cp) // kv_heads


class PlanError(ValueError):
    """The planner cannot describe this config; the message names the key, its value and the fix."""


def per_block(method: Callable[..., T]) -> Callable[..., T]:
    """A ``ModelShape`` method of a block index (and other hashable arguments), answered once per shape: the
    planner asks each block's parameters, FLOPs and activations for tens of thousands of candidates, the same
    question each time (a frozen shape's answers never change)."""

    name = method.__name__  # the key by name: a shape pickles (to spawned processes) with what it remembers

    @functools.wraps(method)
    def remembered(self: ModelShape, *args: Any) -> T:
        return self.remember((name, *args), lambda: method(self, *args))

    return remembered


@dataclass(frozen=True)
class ModelShape:
    """A decoder: embeddings, ``n_layers`` blocks (attention + MLP), final norm, head."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    max_seq_len: int
    layer_d_ff: tuple[int, ...] = ()
    bias: bool = False
    """Linear layers with biases (Megatron's GPT) or without (``models/gpt/model.py``)."""
    tied_embeddings: bool = False
    """Output head shares the token embedding (Megatron's GPT) or has its own (``models/gpt/model.py``)."""
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means ``n_heads`` (multi-head attention)."""
    gated_mlp: bool = False
    """SwiGLU (three d_model x d_ff matrices: w1, w3 in, w2 out) instead of a 2-matrix MLP."""
    norm_params: int = 2
    """Parameters per channel of one norm: 2 for LayerNorm (weight, bias), 1 for RMSNorm."""
    learned_positions: bool = True
    """A ``max_seq_len x d_model`` position table (GPT) or rotary positions without parameters (Llama)."""
    head_dim: int = 0
    """Width of one attention head; 0 means ``d_model / n_heads`` (Qwen3 sets it on its own)."""
    qk_norm: bool = False
    """A norm over each query and key head (Qwen3): two ``head_dim`` weights per block."""
    n_experts: int = 0
    """Routed experts in each sparse layer (0: a dense model)."""
    top_k: int = 0
    """Experts a token runs through in a sparse layer."""
    moe_d_ff: int = 0
    """One expert's SwiGLU width."""
    n_shared_experts: int = 0
    """Experts of width ``moe_d_ff`` every token runs through besides its top-k."""
    sparse: tuple[bool, ...] = ()
    """Per layer: a mixture of experts (True) or a dense MLP of ``layer_d_ff`` (False); empty: all dense. A sparse
    layer's ``layer_d_ff`` is its active width per token, (top_k + n_shared_experts) x moe_d_ff."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3) when > 0: keys and values from a compressed ``kv_lora_rank``
    projection (``wkv_a``, ``wkv_b``); ``head_dim`` is then a query/key head's channels, rotary ones included."""
    q_lora_rank: int = 0
    """MLA's query down-projection width (0: one query projection)."""
    qk_rope_head_dim: int = 0
    """MLA: a query/key head's rotary channels (the keys' one head shared by every query head)."""
    v_head_dim: int = 0
    """MLA: a value head's channels."""
    score_func: str = "softmax"
    """A mixture of experts' router scores: softmax (Qwen3-MoE) or sigmoid in fp32 from an fp32 copy of the input
    (DeepSeek-V3)."""
    n_group: int = 1
    """Expert groups a router picks its experts within (DeepSeek-V3's node-limited routing; 1: none)."""
    topk_group: int = 1
    """The groups a token's experts may lie in (DeepSeek-V3: 4 of 8; one group per node: the nodes a token's rows
    reach under node-limited dispatch, ``parallel/plan/cost_model.py`` ``node_remote_copies``)."""
    sequence_aux_loss: bool = False
    """The balance loss is DeepSeek-V3's sequence-wise one (per sequence) instead of Switch's."""
    mtp_depth: int = 0
    """Multi-token prediction modules after the last block (``models/mtp.py``; DeepSeek-V3: 1), as layers
    ``n_layers`` ... ``n_layers + mtp_depth - 1`` of the last layer's kind (``sparse`` and ``layer_d_ff`` get their
    entries) plus each module's input projection (2h·h), its three norms and one more pass through the output head;
    the pipeline's last stage holds them, with a copy of the token embedding."""
    layer_extra_params: tuple[int, ...] = ()
    """Per block, parameters the formulas here do not see (an architecture's extra norms, biases, attention sinks),
    counted on the built module (the Hugging Face backend's shapes, ``models/hf_transformers/shape.py``); empty:
    none."""
    context_parallel: bool = True
    """The family splits sequences over cp (``ModelSpec.context_parallel``, set by ``models.registry.model_shape``):
    when False the planner ranks no cp > 1, which validation would refuse."""
    rowwise_linears: tuple[str, ...] = ()
    """The linear layers the family's tensor-parallel plan splits by input rows (``SubBlockTP.rowwise``: ``wo``,
    ``w2``; set by ``models.registry.model_shape`` from ``ModelSpec.tp_plan``); the others are column-wise."""
    lora_rank: int = 0
    """``model.lora.rank``: 0 trains every weight; above, only the adapters of ``lora_targets`` train (the weights
    are frozen: no gradients, no optimizer state)."""
    lora_targets: tuple[str, ...] = ()
    """``model.lora.targets``: the linear layers that get adapters (``targeted``)."""
    layer_kinds: tuple[str, ...] = ()
    """Per block, its attention's kind where blocks of one width differ by it (transformers' ``layer_types``:
    ``sliding_attention``, ``full_attention``); empty: one kind."""
    block_saved_bytes: Callable[[int, int, int, int], float] | None = field(default=None, compare=False, repr=False)
    """``(layer, seq_len, element_bytes, tp) -> bytes``: what one sample keeps for backward through block ``layer``,
    counted on the architecture's own module (the Hugging Face backend's blocks, which no closed formula here
    describes: ``models/hf_transformers/activations.py``); None: the cost model's formulas."""

    def __post_init__(self) -> None:
        if not self.layer_d_ff:
            object.__setattr__(self, "layer_d_ff", (4 * self.d_model,) * self.n_layers)
        if not self.n_kv_heads:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if not self.sparse:
            object.__setattr__(self, "sparse", (False,) * self.n_layers)
        for name, what in (("layer_d_ff", "model.layer_d_ff entries"), ("sparse", "sparse-layer flags")):
            value = getattr(self, name)
            if self.mtp_depth and len(value) == self.n_layers:  # the MTP modules: the last layer's kind
                object.__setattr__(self, name, value + value[-1:] * self.mtp_depth)
            elif len(value) != self.n_layers + self.mtp_depth:
                raise PlanError(f"{len(value)} {what} for model.n_layers={self.n_layers}")
        object.__setattr__(self, "_memo", {})  # answers of per_block methods and remember (not a field)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to a spawned process) without what it remembered: the answers are recomputed there."""
        return {k: v for k, v in self.__dict__.items() if k != "_memo"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_memo", {})

    def remember(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, computed once per shape and ``key`` (a function of the shape and hashable arguments):
        the cost model's per-block terms use it as ``per_block`` methods do."""
        memo = self._memo
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def layer_groups(self, layers: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """``layers`` as (one of them, how many) per kind of block: blocks of the same width and sparsity have the same
        parameters, FLOPs and activations, so a sum over a pipeline rank's blocks is a sum over its few kinds (the
        planner sums them for tens of thousands of candidates: per block it spent most of its time there)."""
        key = ("layer_groups", tuple(layers))
        found = self._memo.get(key)
        if found is None:
            counts: dict[Hashable, list[int]] = {}
            for i in key[1]:
                counts.setdefault(self.block_kind(i), []).append(i)
            found = self._memo[key] = tuple((same[0], len(same)) for same in counts.values())
        return found

    def block_kinds(self, layers: Iterable[int]) -> tuple[tuple[Hashable, int], ...]:
        """``layers`` as (kind, how many) per kind of block (``block_kind``): equal for two pipeline ranks whose
        blocks count the same, wherever they sit in the model."""
        key = ("block_kinds", tuple(layers))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = tuple((self.block_kind(i), n) for i, n in self.layer_groups(key[1]))
        return found

    def block_kind(self, i: int) -> Hashable:
        """What block ``i``'s parameters, FLOPs and activations depend on (its width, sparsity, extra parameters,
        whether it is an MTP module, its attention kind; its index only names its modules): blocks of one kind are
        counted once (``layer_groups``)."""
        attention = self.layer_kinds[i] if self.layer_kinds else ""
        return (self.layer_d_ff[i], self.sparse[i], self.layer_extra(i), self.is_mtp(i), attention)

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: n_kv_heads x head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and the output projection's input): n_heads x head_dim (d_model
        unless the head width is set on its own)."""
        return self.n_heads * self.head_dim

    def is_mtp(self, i: int) -> bool:
        """Whether layer ``i`` is an MTP module (past the main model's blocks)."""
        return i >= self.n_layers

    @property
    def mtp_layers(self) -> range:
        return range(self.n_layers, self.n_layers + self.mtp_depth)

    def tp_divides(self, tp: int) -> bool:
        """Whether a tensor-parallel degree gives every rank whole query and key/value heads (a mixture of experts'
        sparse layers are not split by tp: each tp rank runs them whole, ``models/tensor_parallel.py``). With MTP
        modules only tp 1: the tensor-parallel plan does not split them (validation refuses tp > 1)."""
        return self.n_heads % tp == 0 and self.n_kv_heads % tp == 0 and (tp == 1 or not self.mtp_depth)

    # ---- parameters ------------------------------------------------------------------------------

    @per_block
    def layer_matmul_params(self, i: int) -> int:
        """Weights of the block's matrices: wq, wo (h·q_dim, h² by default) + wk, wv (h·kv_dim) + the MLP (2 or 3
        of h·d_ff); a sparse layer: its mixture of experts (``layer_moe_params``); an MTP module: + its input
        projection, 2h·h."""
        mtp = 2 * self.d_model * self.d_model if self.is_mtp(i) else 0
        if self.sparse[i]:
            return self.attention_matmul_params + self.layer_moe_params(i) + mtp
        return self.attention_matmul_params + (3 if self.gated_mlp else 2) * self.d_model * self.layer_d_ff[i] + mtp

    @per_block
    def layer_expert_params(self, i: int) -> int:
        """A sparse layer's routed experts, E x 3·h·moe_d_ff: what expert parallel splits over ep (0 when dense)."""
        return 3 * self.d_model * self.moe_d_ff * self.n_experts if self.sparse[i] else 0

    @per_block
    def layer_moe_params(self, i: int) -> int:
        """A sparse layer's whole feed-forward: routed experts, shared experts (3·h·moe_d_ff each) and the router's
        E·h (0 when dense). meshtrain runs it whole on every tensor-parallel rank."""
        if not self.sparse[i]:
            return 0
        shared = 3 * self.d_model * self.moe_d_ff * self.n_shared_experts
        return self.layer_expert_params(i) + shared + self.layer_router_params(i)

    @per_block
    def layer_router_params(self, i: int) -> int:
        """A sparse layer's router, E·h (0 when dense)."""
        return self.d_model * self.n_experts if self.sparse[i] else 0

    @per_block
    def layer_moe_active_params(self, i: int) -> int:
        """The feed-forward matrices of a sparse layer one token runs through: its top-k and shared experts
        (``layer_d_ff`` wide) and the router (0 when dense)."""
        return 3 * self.d_model * self.layer_d_ff[i] + self.d_model * self.n_experts if self.sparse[i] else 0

    @functools.cached_property
    def attention_matmul_params(self) -> int:
        return sum(n_in * n_out for _, n_in, n_out in self.attention_linears(0))

    @property
    def value_dim(self) -> int:
        """Width of the attention's output before ``wo``: n_heads x the value head width."""
        return self.n_heads * (self.v_head_dim if self.kv_lora_rank else self.head_dim)

    def attention_linears(self, i: int) -> list[tuple[str, int, int]]:
        """The attention's ``nn.Linear`` layers of block ``i`` as (FQN, in, out)."""
        h, a = self.d_model, f"layers.{i}.attention"
        if not self.kv_lora_rank:
            return [(f"{a}.wq", h, self.q_dim), (f"{a}.wk", h, self.kv_dim), (f"{a}.wv", h, self.kv_dim),
                    (f"{a}.wo", self.q_dim, h)]  # fmt: skip
        q_rank, kv_rank, nope = self.q_lora_rank, self.kv_lora_rank, self.head_dim - self.qk_rope_head_dim
        query = (
            [(f"{a}.wq_a", h, q_rank), (f"{a}.wq_b", q_rank, self.q_dim)] if q_rank else [(f"{a}.wq", h, self.q_dim)]
        )
        kv = [
            (f"{a}.wkv_a", h, kv_rank + self.qk_rope_head_dim),
            (f"{a}.wkv_b", kv_rank, self.n_heads * nope + self.value_dim),
        ]
        return [*query, *kv, (f"{a}.wo", self.value_dim, h)]

    @per_block
    def layer_active_matmul_params(self, i: int) -> int:
        """The matrices one token runs through: a sparse layer's top-k and shared experts and the router only."""
        if not self.sparse[i]:
            return self.layer_matmul_params(i)
        mtp = 2 * self.d_model * self.d_model if self.is_mtp(i) else 0
        return self.attention_matmul_params + self.layer_moe_active_params(i) + mtp

    @per_block
    def layer_params(self, i: int) -> int:
        """Matrices + two norms (+ biases): for the GPT Megatron's 12h² + 13h."""
        h, f = self.d_model, self.layer_d_ff[i]
        biases = (self.q_dim + h + 2 * self.kv_dim) + (2 if self.gated_mlp else 1) * f + h if self.bias else 0
        if self.sparse[i]:
            biases = 0  # the experts and the router have none (Qwen3-MoE, DeepSeek-V3)
        mtp_norms = 3 * self.norm_params * h if self.is_mtp(i) else 0  # enorm, hnorm, the head's norm
        return self.layer_matmul_params(i) + self.layer_norm_params(i) + biases + self.layer_extra(i) + mtp_norms

    def layer_extra(self, i: int) -> int:
        """Block ``i``'s ``layer_extra_params`` (0 when none are given)."""
        return self.layer_extra_params[i] if i < len(self.layer_extra_params) else 0

    @per_block
    def layer_norm_params(self, i: int) -> int:
        """The block's two norms (and its query/key head norms): the part tensor parallel does not shard."""
        latent = self.norm_params * (self.q_lora_rank + self.kv_lora_rank)  # MLA's q_norm and kv_norm
        return (
            2 * self.norm_params * self.d_model + (2 * self.norm_params * self.head_dim if self.qk_norm else 0) + latent
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model + (self.max_seq_len * self.d_model if self.learned_positions else 0)

    @property
    def head_params(self) -> int:
        """Final norm and, unless tied, the output projection V·h."""
        return self.norm_params * self.d_model + (0 if self.tied_embeddings else self.vocab_size * self.d_model)

    @property
    def params(self) -> int:
        """Every parameter, each expert included: what memory holds (the MTP modules' too; their embedding and head
        are the main model's)."""
        blocks = sum(self.layer_params(i) for i in range(self.n_layers + self.mtp_depth))
        return self.embedding_params + blocks + self.head_params

    @property
    def active_params(self) -> int:
        """The parameters one token runs through (a dense model: ``params``), the "A3B" of Qwen3-30B-A3B."""
        layers = range(self.n_layers + self.mtp_depth)
        idle = sum(self.layer_matmul_params(i) - self.layer_active_matmul_params(i) for i in layers)
        return self.params - idle

    # ---- what trains (LoRA: only the adapters) -------------------------------------------------------

    @per_block
    def layer_linears(self, i: int) -> tuple[tuple[str, int, int], ...]:
        """The block's ``nn.Linear`` layers as (FQN, in, out), named as meshtrain's models name them
        (``layers.N.attention.wq``, ``layers.N.feed_forward.w1``; a sparse layer's shared experts
        ``layers.N.feed_forward.shared.w1``; its routed experts and router are not linear layers)."""
        h, f = self.d_model, f"layers.{i}.feed_forward"
        out = list(self.attention_linears(i))
        if self.sparse[i]:
            shared = self.moe_d_ff * self.n_shared_experts
            mlp = ((f"{f}.shared.w1", h, shared), (f"{f}.shared.w2", shared, h), (f"{f}.shared.w3", h, shared))
            return tuple(out) + (mlp if shared else ())
        d = self.layer_d_ff[i]
        out += [(f"{f}.w1", h, d), (f"{f}.w2", d, h)] + ([(f"{f}.w3", h, d)] if self.gated_mlp else [])
        return tuple(out)

    def layer_adapted_linears(self, i: int) -> list[tuple[str, int, int]]:
        """Block ``i``'s linear layers that LoRA adapts (none without LoRA)."""
        return [x for x in self.layer_linears(i) if self.lora_rank > 0 and targeted(x[0], self.lora_targets)]

    @property
    def head_adapted_linears(self) -> list[tuple[str, int, int]]:
        """The output projection (``output``) when LoRA adapts it; a tied head is the embedding, never adapted."""
        head = ("output", self.d_model, self.vocab_size)
        return (
            [head] if self.lora_rank > 0 and not self.tied_embeddings and targeted("output", self.lora_targets) else []
        )

    @per_block
    def layer_trainable_params(self, i: int) -> int:
        """Parameters of block ``i`` that have gradients and optimizer state: all of them, or with LoRA its adapters
        (``lora_A``, rank x in, and ``lora_B``, out x rank, per adapted linear layer)."""
        if self.lora_rank <= 0:
            return self.layer_params(i)
        return sum(self.lora_rank * (n_in + n_out) for _, n_in, n_out in self.layer_adapted_linears(i))

    @property
    def head_trainable_params(self) -> int:
        """With LoRA: the output projection's adapters when it is adapted; else 0."""
        return sum(self.lora_rank * (n_in + n_out) for _, n_in, n_out in self.head_adapted_linears)

    @property
    def trainable_params(self) -> int:
        """Parameters with gradients and optimizer state (``params`` without LoRA)."""
        if self.lora_rank <= 0:
            return self.params
        return sum(self.layer_trainable_params(i) for i in range(self.n_layers)) + self.head_trainable_params

    # ---- FLOPs -----------------------------------------------------------------------------------

    @per_block
    def layer_forward_flops_per_token(self, i: int, seq_len: int) -> float:
        """Matmul FLOPs of one block per token, forward: 2·(its matrices) + attention 2·2·s·h.

        A sparse layer counts the matrices a token runs through (``layer_active_matmul_params``). For the GPT
        2·(4h² + 2·h·d_ff) + 4sh: Megatron-LM 2021 (arXiv 2104.04473, appendix
        "Floating-point operations"), 24h² + 4sh per token with d_ff = 4h; the attention score and value
        products are counted in full (no causal halving), as there: 2·s·(query width + value width) (MLA's
        query/key heads, rotary channels included, and its value heads each at their own width).
        """
        logits = self.logit_forward_flops_per_token() if self.is_mtp(i) else 0  # an MTP module's pass through the head
        return 2 * self.layer_active_matmul_params(i) + 2 * seq_len * (self.q_dim + self.value_dim) + logits

    def logit_forward_flops_per_token(self) -> float:
        """The output projection: 2·V·h per token (Megatron: the V/(16lh) term of the FLOPs formula)."""
        return 2 * self.vocab_size * self.d_model

    def training_flops_per_token(self, seq_len: int, *, recompute: str = "none") -> float:
        """Forward + backward (2× forward) FLOPs per token; full recomputation re-runs every block forward.

        With ``recompute="full"`` this is Megatron-LM 2021's 96·B·s·l·h²(1 + s/6h + V/16lh) per iteration
        divided by B·s tokens (arXiv 2104.04473, eq. 3). Selective recomputation (arXiv 2205.05198) re-runs
        only the attention score/softmax/value part: + 4sh per layer and token. The MTP modules count as blocks
        (each with its pass through the head).
        """
        layers = sum(self.layer_forward_flops_per_token(i, seq_len) for i in range(self.n_layers + self.mtp_depth))
        extra = {"none": 0.0, "selective": 4.0 * seq_len * self.d_model * self.n_layers, "full": layers}[recompute]
        return 3 * layers + extra + 3 * self.logit_forward_flops_per_token()


def refuse_to_build(**kwargs: Any) -> None:
    """``_target_`` of planner-only model descriptions (``gpt_175b`` ...): they describe a model to the planner and
    are too big to build here, so building one is a mistake, said clearly (validation refuses them first)."""
    name = kwargs.get("name", "this model")
    raise PlanError(
        f"model={name} is a description for the planner (python -m parallel.plan model={name} ...), "
        "too big to build here; train a buildable model such as model=gpt_small"
    )
