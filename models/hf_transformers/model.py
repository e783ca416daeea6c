"""``HFCausalLM``: a transformers ``AutoModelForCausalLM`` run by its own modules, laid out as meshtrain's decoders.

transformers builds the model from ``config.json`` (on whatever device is the default: the meta device for a
sharded or pipelined run); its parts are then held the way every meshtrain decoder holds its own: the token
embedding ``embed_tokens``, the decoder layers in ``layers`` (a ``ModuleDict`` keyed "0".."n-1", transformers' own
layer modules), the final ``norm``, the head ``lm_head`` and the parameterless parts (``rotary_emb``), so pipeline
stages, FSDP units, activation checkpointing and compile find the blocks where they find the native ones. Names
are transformers' without the base model's prefix (``layers.0.self_attn.q_proj.weight`` is the checkpoint's
``model.layers.0.self_attn.q_proj.weight``).

``forward`` is the base model's forward written once for every architecture: the embedding (times the config's
``embedding_multiplier``, Granite), the masks transformers' own ``masking_utils`` builds for each layer type
(causal, sliding window; packed documents from positions that restart at 0), the rotary tables (per layer type
where the rotary module takes one, Gemma 3), each layer called as its base model calls it, the final norm, the head
and the config's logit transforms (Granite's ``logits_scaling``, Gemma's ``final_logit_softcapping``). A later
pipeline stage gets the hidden states and rebuilds positions, rotary tables and masks itself.

Context parallel (``parallel/techniques/cp.py``) wraps each attention module's ``attend`` (causal SDPA over
``(b, t, heads, d)`` at the module's own ``scaling``) in Ulysses' all-to-alls; the first forward after that routes
those modules through transformers' ``AttentionInterface`` entry ``meshtrain_ulysses`` (on a copy of their config, so
the masks keep the configured kernel's), which hands transformers' q, k, v to ``attend``. The mask of the local chunk
is dropped: the kernel is causal over the whole sequence (packed documents and sliding windows are refused under
cp, ``spec.py``); positions start at the chunk's first token (``seq_chunk``), so the rotary tables are global.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import chunk_start
from models.documents import unpack_inputs
from models.hf_transformers.config import HFTransformersConfig
from models.hf_transformers.experts import install as install_experts
from models.spec import config_or_fields

FULL, SLIDING = "full_attention", "sliding_attention"
ULYSSES = "meshtrain_ulysses"


def causal_scaled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaling: float | None = None, dropout: float = 0.0, **_: Any
) -> torch.Tensor:
    """Causal SDPA of (b, t, heads, d) queries over (b, t, kv_heads, d) keys and values at transformers' ``scaling``
    (the attention module's): the kernel context parallel wraps. Returns (b, t, heads, d)."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scaling, enable_gqa=gqa)
    return y.transpose(1, 2)


def ulysses_interface(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """transformers' attention function under context parallel: its (b, heads, t, d) of this rank's chunk to the
    module's ``attend`` (the all-to-alls around ``causal_scaled``); the chunk's mask is not used (causal over the
    whole sequence). Returns (b, t, heads, d) as transformers' kernels do."""
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    keep = {name: kwargs[name] for name in ("scaling", "dropout") if name in kwargs}
    return module.attend(q, k, v, **keep), None


def register_ulysses() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ULYSSES, ulysses_interface)


def load_hf_config(config: Any) -> Any:
    """transformers' config of ``config.config_dir`` (its own code only with ``trust_remote_code``)."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(config.config_dir), trust_remote_code=bool(config.trust_remote_code))
    if config.attn_implementation:
        hf._attn_implementation = str(config.attn_implementation)
    hf.use_cache = False
    return hf


def layer_types(hf: Any) -> list[str]:
    """Each layer's attention kind: config.json's ``layer_types``, else sliding everywhere when the config sets a
    ``sliding_window`` (Mistral, Mixtral, Phi-3 pick their mask that way), else full."""
    n = int(hf.num_hidden_layers)
    given = getattr(hf, "layer_types", None)
    if given:
        return [str(t) for t in given[:n]]
    return [SLIDING if getattr(hf, "sliding_window", None) else FULL] * n


class HFCausalLM(nn.Module):
    """``HFCausalLM(HFTransformersConfig(config_dir=DIR))``: DIR's architecture, transformers' modules."""

    def __init__(self, config: HFTransformersConfig | None = None, *, hf_config: Any = None, **fields: Any):
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.config = c = config_or_fields(HFTransformersConfig, config, fields)
        # ``hf_config``: transformers' config to build instead of config_dir's (the planner's per-rank sizes)
        self.hf_config = hf = hf_config if hf_config is not None else load_hf_config(c)
        model = AutoModelForCausalLM.from_config(hf, trust_remote_code=bool(c.trust_remote_code))
        base = model.get_decoder()
        self.embed_tokens: nn.Module | None = base.embed_tokens
        self.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(base.layers)})
        self.norm: nn.Module | None = base.norm
        self.lm_head: nn.Module | None = model.get_output_embeddings()
        extra = [n for n, _ in base.named_children() if n not in ("embed_tokens", "layers", "norm")]
        for name in extra:  # rotary tables and the like: every stage keeps them
            setattr(self, name, getattr(base, name))
        install_experts(self)  # MoE experts behind meshtrain's dispatch seam (expert parallel)
        self.layer_types = layer_types(hf)
        rotary = getattr(self, "rotary_emb", None)
        self._rotary_by_type = rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters
        # transformers' _init_weights, called on this module's parts (it needs a model of its class and the config)
        shell = type(model).__new__(type(model))
        nn.Module.__init__(shell)
        shell.config = hf
        object.__setattr__(self, "_hf_init", shell)
        self.seq_chunk = 0  # which contiguous chunk of the sequence the inputs are (context parallel sets it)
        for layer in self.layers.values():  # the kernel context parallel wraps (used only then)
            if isinstance(getattr(layer, "self_attn", None), nn.Module):
                layer.self_attn.attend = causal_scaled

    # ---- forward ---------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: token ids ``(b, t)``, a packed batch ``(b, 2, t)`` (ids and positions within each document), or,
        on a later pipeline stage, the hidden states ``(b, t, d)``."""
        if self.embed_tokens is not None:
            tokens, positions = unpack_inputs(x)
            h = self.embed_tokens(tokens)
            scale = getattr(self.hf_config, "embedding_multiplier", None)
            if scale is not None and float(scale) != 1.0:
                h = h * float(scale)
        else:
            h, positions = x, None
        packed = positions
        if positions is None:
            start = chunk_start(self.seq_chunk, h.shape[1])
            positions = torch.arange(start, start + h.shape[1], device=h.device).unsqueeze(0)
        self._route_context_parallel()
        kinds = {self.layer_types[int(k)] for k in self.layers}
        masks = {kind: self._mask(kind, h, packed) for kind in kinds}
        rotary = {kind: self._rotary(kind, h, positions) for kind in kinds}
        for key, layer in self.layers.items():
            kind = self.layer_types[int(key)]
            out = layer(h, attention_mask=masks[kind], position_embeddings=rotary[kind], position_ids=positions)
            h = out[0] if isinstance(out, tuple) else out
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self._logits(self.lm_head(h))
        return h

    def _route_context_parallel(self) -> None:
        """Attention modules whose ``attend`` context parallel wrapped (it keeps the kernel as ``inner``) run through
        ``ULYSSES``, on their own copy of the config (the masks are built from the model's, unchanged)."""
        for layer in self.layers.values():
            attn = getattr(layer, "self_attn", None)
            if hasattr(getattr(attn, "attend", None), "inner") and attn.config._attn_implementation != ULYSSES:
                register_ulysses()
                attn.config = copy.copy(attn.config)
                attn.config._attn_implementation = ULYSSES

    def _mask(self, kind: str, h: torch.Tensor, positions: torch.Tensor | None) -> Any:
        """transformers' mask for ``kind``: from the documents' positions when a batch is packed; else None where the
        causal kernel needs none (full attention, a window no shorter than the sequence), as it decides in a real run
        and under fake tensors (the dry run) alike: given plain positions there, transformers cannot see that no
        document boundary is among them and builds a mask."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        build = create_sliding_window_causal_mask if kind == SLIDING else create_causal_mask
        return build(config=self.hf_config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=positions)

    def _rotary(self, kind: str, h: torch.Tensor, positions: torch.Tensor) -> Any:
        rotary = getattr(self, "rotary_emb", None)
        if rotary is None:
            return None
        return rotary(h, positions, kind) if self._rotary_by_type else rotary(h, positions)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        hf = self.hf_config
        scaling = getattr(hf, "logits_scaling", None)
        if scaling is not None and float(scaling) != 1.0:
            logits = logits / float(scaling)
        cap = getattr(hf, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ---- after a meta-device build -----------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self) -> None:
        """transformers' ``_init_weights`` of the architecture on every part this (possibly sharded, possibly pruned)
        module holds, rotary tables included."""
        for module in self.modules():
            if module is not self:
                self._hf_init._init_weights(module)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """What no checkpoint holds (rotary tables, Gemma's embedding scale): the architecture's init, whose drawn
        weights the checkpoint then overwrites."""
        self.init_weights()
