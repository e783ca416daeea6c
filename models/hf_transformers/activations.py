"""What a Hugging Face backend block keeps for backward, counted on the architecture's own module.

meshtrain's cost model writes its families' saved activations as closed formulas (``parallel/plan/cost_model.py``:
``saved_layer_activation_bytes``), each counted from the tensors autograd saves in meshtrain's own blocks. The
backend's blocks are transformers' code, and what they keep differs by architecture in ways no one formula of
meshtrain's sees: an SDPA layer with a sliding window shorter than the sequence gets a materialised mask, which the
kernel converts to the activation dtype and keeps (b·s² per layer), and its key/value heads repeated to the query
heads (transformers repeats them whenever a mask is given); Gemma 3 has four norms per block and per-head query/key
norms; OLMo 2 full-width ones; Phi-3 a fused qkv projection whose output the value is a view of; gpt-oss eager
attention (the s² probabilities, with its sinks) and a clamped gate keeping five tensors per expert row; MLA's
latent projections. So the planner asks the module itself: ``block_saved_bytes`` runs one sample through one block
of the architecture on fake tensors (nothing allocated, any size), under the same saved-tensor hook as the dry run
(``parallel/plan/dry_run.py``: one count per storage, parameters excluded), with its mask and rotary tables as the
backend's forward builds them, and the cost model scales the count by the micro-batch (every saved tensor is per
sample). A tensor-parallel rank's block is counted as the block of a config with the heads and the feed-forward
width divided by tp (what ``base_model_tp_plan`` leaves each rank: whole heads, a slice of the MLP; the experts run
whole), so norms and the replicated block input stay whole. Each (block kind, sequence length, dtype, tp) is counted
once per process (about 20 ms for a debug-size block).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def block_counter(config_dir: str, trust_remote_code: bool, kinds: tuple[int, ...]) -> Callable[..., float]:
    """``ModelShape.block_saved_bytes`` of the architecture in ``config_dir``: ``(layer, seq_len, element_bytes, tp)``
    -> the bytes one sample of ``seq_len`` tokens keeps for backward through decoder layer ``layer`` on one
    tensor-parallel rank of ``tp``, activations of ``element_bytes`` (4: fp32, 2: bf16). ``kinds[i]``: the first
    layer built as layer ``i`` is (the same parameters and attention kind), whose count serves both."""
    return functools.partial(_count_layer, config_dir, trust_remote_code, kinds)


def _count_layer(
    config_dir: str,
    trust_remote_code: bool,
    kinds: tuple[int, ...],
    layer: int,
    seq_len: int,
    element_bytes: int,
    tp: int,
) -> float:
    return _counted(config_dir, trust_remote_code, kinds[layer], int(seq_len), int(element_bytes), int(tp))


@functools.lru_cache(maxsize=512)
def _counted(config_dir: str, trust_remote_code: bool, layer: int, seq_len: int, element_bytes: int, tp: int) -> float:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = _meta_model(config_dir, trust_remote_code, tp)
    block = model.layers[str(layer)]
    dtype = torch.float32 if element_bytes == 4 else torch.bfloat16
    kind = model.layer_types[layer]
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = {}
        for name, p in block.named_parameters():
            params[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=dtype), requires_grad=p.requires_grad)
        buffers = {n: torch.empty(b.shape, dtype=b.dtype) for n, b in model.named_buffers() if b.is_meta}
        ignore = {p.untyped_storage()._cdata for p in params.values()}
        storages: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in ignore:
                storages[st._cdata] = st.nbytes()
            return t

        seq_len = int(seq_len)
        h = torch.randn(1, seq_len, model.hf_config.hidden_size, dtype=dtype, requires_grad=True)
        positions = torch.arange(seq_len).unsqueeze(0)
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(model, {f"layers.{layer}.{n}": p for n, p in params.items()} | buffers):
            mask, rotary = model._mask(kind, h, None), model._rotary(kind, h, positions)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                block(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
    return float(sum(storages.values()))


@functools.lru_cache(maxsize=16)
def _meta_model(config_dir: str, trust_remote_code: bool, tp: int) -> Any:
    """The architecture on the meta device, as one of ``tp`` tensor-parallel ranks holds its blocks: the heads and
    the dense feed-forward width / tp, the head width kept (MLA's from its own keys)."""
    import torch

    from models.hf_transformers.config import HFTransformersConfig, n_experts
    from models.hf_transformers.model import HFCausalLM, load_hf_config

    config = HFTransformersConfig(config_dir=config_dir, trust_remote_code=trust_remote_code)
    hf = load_hf_config(config)
    if tp > 1:
        heads = int(hf.num_attention_heads)
        if not getattr(hf, "kv_lora_rank", None):
            hf.head_dim = getattr(hf, "head_dim", None) or int(hf.hidden_size) // heads
        hf.num_attention_heads = heads // tp
        if getattr(hf, "num_key_value_heads", None):
            hf.num_key_value_heads = max(1, int(hf.num_key_value_heads) // tp)
        experts_own_width = getattr(hf, "moe_intermediate_size", None) or not n_experts(config)
        if getattr(hf, "intermediate_size", None) and experts_own_width:  # Mixtral's experts are this wide: whole
            hf.intermediate_size = int(hf.intermediate_size) // tp
    with torch.device("meta"):
        return HFCausalLM(config, hf_config=hf)
