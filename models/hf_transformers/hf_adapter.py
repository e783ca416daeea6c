"""The Hugging Face backend <-> its model folder: the names are transformers' own, so the adapter puts back the base
model's prefix (``layers.0.mlp.up_proj.weight`` is ``model.layers.0.mlp.up_proj.weight``; the head ``lm_head.weight``
keeps its name), reads a tied head from the embedding, and writes config.json as the folder had it.

One exception, transformers' own: its MoE families fuse a layer's experts in memory (``mlp.experts.gate_up_proj``,
(experts, 2 x width, hidden): each expert's gate rows, then its up rows; ``mlp.experts.down_proj``) while their
checkpoints hold one tensor per expert, as ``save_pretrained`` writes and ``from_pretrained`` reads them
(transformers' ``conversion_mapping``): Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2``, and Qwen2-MoE's
``mlp.experts.{e}.gate_proj/up_proj/down_proj`` (DeepSeek-V3, Qwen3-MoE, OLMoE ...). ``Experts`` reads a rank's
slice of the fused tensor from those files and writes them back per expert on export. gpt-oss stores its experts
fused, as in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models.hf_adapter import HFAdapter, Reader, Shape, Source, over_base
from models.hf_transformers.config import hf_json, tied

if TYPE_CHECKING:
    import torch

PREFIX = "model."
HEAD = "lm_head.weight"
#: checkpoint layout of the fused experts -> (the layer's MoE module in the checkpoint, gate/up names, down name)
EXPERT_FILES = {
    "mixtral": ("block_sparse_moe", ("w1", "w3"), "w2"),
    "qwen2_moe": ("mlp", ("gate_proj", "up_proj"), "down_proj"),
}
FUSED = {"gate_up_proj": 0, "down_proj": 1}


def expert_layout(model_type: str) -> tuple[str, tuple[str, ...], str] | None:
    """How ``model_type``'s checkpoints hold its experts (transformers' ``_MODEL_TO_CONVERSION_PATTERN``), or
    None: as in memory."""
    from transformers.conversion_mapping import _MODEL_TO_CONVERSION_PATTERN

    return EXPERT_FILES.get(_MODEL_TO_CONVERSION_PATTERN.get(model_type, model_type))


@dataclass(frozen=True)
class Experts:
    """A fused (experts, parts x width, ...) tensor held as one checkpoint tensor per expert and part; ``keys`` are
    the parts' names with ``{e}`` for the expert (gate then up, or down alone)."""

    keys: tuple[str, ...]

    def hf_tensors(self, shape: Shape) -> dict[str, Shape]:
        width = shape[1] // len(self.keys)
        return {k.replace("{e}", str(e)): (width, *shape[2:]) for e in range(shape[0]) for k in self.keys}

    def take(self, read: Reader, index: tuple[slice, ...], shape: Shape) -> torch.Tensor:
        import torch

        width = shape[1] // len(self.keys)
        lo, hi, _ = index[1].indices(shape[1])
        out = []
        for e in range(*index[0].indices(shape[0])):
            rows = []
            for p, key in enumerate(self.keys):
                a, b = max(lo, p * width), min(hi, (p + 1) * width)
                if a < b:
                    name = key.replace("{e}", str(e))
                    rows.append(read(name, (slice(a - p * width, b - p * width), *index[2:])))
            out.append(torch.cat(rows))
        return torch.stack(out)

    def write(self, out: dict[str, torch.Tensor], value: torch.Tensor) -> None:
        width = value.shape[1] // len(self.keys)
        for e in range(value.shape[0]):
            for p, key in enumerate(self.keys):
                out[key.replace("{e}", str(e))] = value[e, p * width : (p + 1) * width].clone()


class TransformersAdapter(HFAdapter):
    model_type = "*"
    architecture = "AutoModelForCausalLM"
    embedding = "embed_tokens.weight"
    head = HEAD
    prefix = PREFIX

    def tied(self, model: Mapping[str, Any]) -> bool:
        return tied(model)

    def source(self, fqn: str, model: Mapping[str, Any]) -> Source | Experts | None:
        if fqn == HEAD and self.tied(model):
            fqn = self.embedding
        if fqn.startswith("lm_head."):
            return Source(fqn)
        layout = expert_layout(str(hf_json(model).get("model_type"))) if ".mlp." in fqn else None
        if layout is None:
            return Source(PREFIX + fqn)
        module, gate_up, down = layout
        layer, _, fused = fqn.rpartition(".experts.")
        if fused not in FUSED:  # the router and the rest of the block: only the module's name differs (Mixtral)
            return Source(PREFIX + fqn.replace(".mlp.", f".{module}.", 1))
        base = f"{PREFIX}{layer.rsplit('.', 1)[0]}.{module}.experts.{{e}}"
        names = gate_up if FUSED[fused] == 0 else (down,)
        return Experts(tuple(f"{base}.{n}.weight" for n in names))

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return over_base({}, base if base is not None else hf_json(model))

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """Nothing to compare: the architecture is config.json itself."""
        return {}

    def training_fields(self, hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return {}, []  # transformers' modules read dropout from config.json as the folder has it


ADAPTER = TransformersAdapter()
