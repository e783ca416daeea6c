"""What every model family's Hugging Face adapter shares: meshtrain's parameter names, tensors and model config
on one side, a transformers model folder's (``config.json`` + safetensors) on the other.

A family's adapter (``models/<family>/hf_adapter.py``, named by its ``ModelSpec.hf_adapter``) answers, in one
place each:

- ``source(fqn, model)``: where a meshtrain tensor's values sit in the HF checkpoint, as a ``Source`` (the HF
  name; the part of a fused tensor; a transposed storage; the rotary permutation). The loader reads through it
  only the slice a rank holds (``Source.take``); ``to_hf`` / ``from_hf`` convert whole state dicts with the same
  rule, so the two directions cannot drift apart;
- ``hf_config(model)`` / ``model_config(hf)``: meshtrain's model config to ``config.json`` and back;
- ``ignored(hf_key, model)``: tensors a checkpoint may carry that hold nothing meshtrain needs (a tied head's
  copy, old attention-mask buffers).

Names are templates with ``{}`` for the layer index (``layers.{}.attention.wq.weight`` ->
``model.layers.{}.self_attn.q_proj.weight``), the convention of torchtitan's state-dict adapters.

**The rotary permutation.** meshtrain's rotary embedding (as Meta's reference Llama) rotates each head's channel
pairs (2i, 2i + 1); transformers rotates halves (i, i + head_dim / 2). The two compute the same attention when
the rows of the query and key projections are reordered inside each head: HF's row (half c, index i) is
meshtrain's row (pair i, member c). Only q and k rows move (and Qwen3's per-head q/k norm weights, which scale
the same channels); values, outputs and the MLP keep their order. A conversion that forgets it still loads
without error and produces garbage, the failure converted checkpoints are most often reported for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the adapters run on tensors but import no torch: validation reads their config maps
    import torch

Shape = tuple[int, ...]
#: ``read(hf_key, index)``: the HF tensor ``hf_key`` restricted to ``index`` (a tuple of slices), and only that
Reader = Callable[[str, tuple[slice, ...]], "torch.Tensor"]


class HFConfigError(ValueError):
    """A ``config.json`` that this family cannot represent; the message names the key and what is supported."""


@dataclass(frozen=True)
class Source:
    """Where one meshtrain tensor's values are in the HF checkpoint."""

    key: str
    transpose: bool = False
    """HF stores it (in, out), as GPT-2's ``Conv1D`` does: meshtrain's rows are its columns."""
    part: int = 0
    parts: int = 1
    """This tensor is block ``part`` of ``parts`` equal blocks stacked along HF's output dimension (GPT-2's
    fused q/k/v ``c_attn``)."""
    heads: int = 0
    """More than 0: the rows hold that many rotary heads, in pairs here and in halves in HF (module docstring)."""

    def hf_row(self, row: int, rows: int) -> int:
        """The HF output row that holds meshtrain's ``row`` (of ``rows``)."""
        if self.heads:
            head_dim = rows // self.heads
            head, within = divmod(row, head_dim)
            pair, member = divmod(within, 2)
            row = head * head_dim + member * (head_dim // 2) + pair
        return self.part * rows + row

    def hf_shape(self, shape: Shape) -> Shape:
        """The HF tensor's shape, from meshtrain's (all ``parts`` of equal size)."""
        out = (shape[0] * self.parts, *shape[1:])
        return tuple(reversed(out)) if self.transpose else out

    def take(self, read: Reader, index: tuple[slice, ...], shape: Shape) -> torch.Tensor:
        """meshtrain's ``tensor[index]`` (the tensor's full shape is ``shape``), read through ``read``: the HF rows
        that hold it (a head-aligned cover when permuted) and only the columns in ``index``."""
        rows = range(*index[0].indices(shape[0]))
        want = [self.hf_row(r, shape[0]) for r in rows]
        lo, hi = min(want), max(want) + 1
        rest = tuple(index[1:])
        block = read(self.key, (*rest, slice(lo, hi))).T if self.transpose else read(self.key, (slice(lo, hi), *rest))
        return block if want == list(range(lo, hi)) else block[[w - lo for w in want]]

    def put(self, hf: torch.Tensor, value: torch.Tensor) -> None:
        """Write meshtrain's whole ``value`` into its place in the whole HF tensor ``hf`` (``take``'s inverse)."""
        n = value.shape[0]
        target = hf.T if self.transpose else hf
        if not self.heads:  # hf_row is part * n + row: one block of rows, written as a slice
            target[self.part * n : (self.part + 1) * n] = value
            return
        target[[self.hf_row(r, n) for r in range(n)]] = value

    def hf_tensors(self, shape: Shape) -> dict[str, Shape]:
        """The HF tensors (name -> shape) this one is read from."""
        return {self.key: self.hf_shape(shape)}

    def write(self, out: dict[str, torch.Tensor], value: torch.Tensor) -> None:
        """Put ``value`` into the HF state dict ``out`` being assembled (its tensor made on first use)."""
        if self.key not in out:
            out[self.key] = value.new_zeros(self.hf_shape(tuple(value.shape)))
        self.put(out[self.key], value)


@dataclass(frozen=True)
class Stacked:
    """A meshtrain tensor whose dim 0 stacks HF tensors, one per index (a MoE block's experts: ``experts.w1`` is
    (E, ff, d); the checkpoint holds E ``experts.{e}.gate_proj.weight`` of (ff, d)). ``key`` has ``{e}`` for the
    index (the layer's ``{}`` already filled)."""

    key: str

    def sources(self, count: int) -> list[Source]:
        return [Source(self.key.replace("{e}", str(e))) for e in range(count)]

    def hf_tensors(self, shape: Shape) -> dict[str, Shape]:
        return {src.key: tuple(shape[1:]) for src in self.sources(shape[0])}

    def take(self, read: Reader, index: tuple[slice, ...], shape: Shape) -> torch.Tensor:
        import torch

        srcs = self.sources(shape[0])[index[0]]
        return torch.stack([s.take(read, index[1:], tuple(shape[1:])) for s in srcs])

    def write(self, out: dict[str, torch.Tensor], value: torch.Tensor) -> None:
        for src, part in zip(self.sources(value.shape[0]), value):
            out[src.key] = part.clone()


LAYER = re.compile(r"^(?P<head>.*?layers)\.(?P<index>\d+)\.(?P<tail>.+)$")


def template(fqn: str) -> tuple[str, int | None]:
    """``layers.3.attention.wq.weight`` -> (``layers.{}.attention.wq.weight``, 3); other names unchanged."""
    m = LAYER.match(fqn)
    return (f"{m['head']}.{{}}.{m['tail']}", int(m["index"])) if m else (fqn, None)


def fill(name: str, index: int | None) -> str:
    """The layer's ``{}`` filled (a ``Stacked`` key's ``{e}`` left for the expert)."""
    return name.replace("{}", str(index)) if index is not None else name


class HFAdapter:
    """The shared machinery; a family sets the class attributes and writes its two config functions."""

    model_type: str = ""
    """``config.json``'s ``model_type`` this family reads and writes."""
    architecture: str = ""
    """transformers' class for it (``config.json``'s ``architectures``)."""
    keys: Mapping[str, str | Source | Stacked] = {}
    """meshtrain name template -> HF name template (or a ``Source`` whose ``key`` is one: a part, a transpose; or a
    ``Stacked`` one: per-expert tensors)."""
    rotary: Mapping[str, str] = {}
    """meshtrain name template -> the config key giving its number of rotary heads (1: one head's channels)."""
    embedding: str = "tok_embeddings.weight"
    head: str = "output.weight"
    prefix: str = ""
    """HF's base-model prefix that published files may leave out (GPT-2's ``transformer.``)."""

    # ---- names and tensors -----------------------------------------------------------------------

    def tied(self, model: Mapping[str, Any]) -> bool:
        return bool(model.get("tie_embeddings", False))

    def hf_name(self, fqn: str) -> str | None:
        src = self._mapped(fqn)
        return src.key if src is not None else None

    def _mapped(self, fqn: str) -> Source | Stacked | None:
        name, index = template(fqn)
        found = self.keys.get(name)
        if found is None:
            return None
        src = found if isinstance(found, (Source, Stacked)) else Source(found)
        return replace(src, key=fill(src.key, index))

    def source(self, fqn: str, model: Mapping[str, Any]) -> Source | None:
        """Where ``fqn`` comes from (a tied head reads the embedding); None: no HF tensor holds it."""
        if fqn == self.head and self.tied(model):
            fqn = self.embedding
        src = self._mapped(fqn)
        heads_key = self.rotary.get(template(fqn)[0])
        if src is None or not heads_key:
            return src
        return replace(src, heads=self.rotary_heads(heads_key, model))

    @staticmethod
    def rotary_heads(key: str, model: Mapping[str, Any]) -> int:
        if key == "one":
            return 1
        value = int(model.get(key) or 0)
        return value or int(model["n_heads"])  # n_kv_heads = 0 means as many as the query heads

    def ignored(self, hf_key: str, model: Mapping[str, Any]) -> bool:
        """An HF tensor meshtrain does not need: the head's copy when the embedding is tied."""
        return self.tied(model) and hf_key == self.hf_name(self.head)

    def locate(self, key: str, stored: Mapping[str, Any] | set[str]) -> str | None:
        """The name ``key`` is stored under (with or without ``prefix``); None when absent."""
        if key in stored:
            return key
        if self.prefix and key.startswith(self.prefix) and key[len(self.prefix) :] in stored:
            return key[len(self.prefix) :]
        return None

    def hf_shapes(self, shapes: Mapping[str, Shape], model: Mapping[str, Any]) -> dict[str, Shape]:
        """The HF tensors (name -> shape) a model with these meshtrain tensors reads; raises on unmapped names."""
        out: dict[str, Shape] = {}
        for fqn, shape in shapes.items():
            src = self.source(fqn, model)
            if src is None:
                raise KeyError(f"{fqn}: the {self.model_type} adapter has no Hugging Face name for it")
            out.update(src.hf_tensors(tuple(shape)))
        return out

    def to_hf(self, state: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Whole meshtrain tensors -> whole HF tensors (export). A tied head is written once, as the embedding."""
        out: dict[str, torch.Tensor] = {}
        for fqn, value in state.items():
            if fqn == self.head and self.tied(model):
                continue
            src = self.source(fqn, model)
            if src is None:
                raise KeyError(f"{fqn}: the {self.model_type} adapter has no Hugging Face name for it")
            src.write(out, value.detach())
        return out

    def from_hf(
        self, hf: Mapping[str, torch.Tensor], model: Mapping[str, Any], shapes: Mapping[str, Shape]
    ) -> dict[str, torch.Tensor]:
        """Whole HF tensors -> whole meshtrain tensors of ``shapes`` (the same rule the sharded loader reads by)."""

        def read(key: str, index: tuple[slice, ...]) -> torch.Tensor:
            return hf[self.locate(key, hf) or key][index]

        out = {}
        for fqn, shape in shapes.items():
            src = self.source(fqn, model)
            if src is None:
                raise KeyError(f"{fqn}: the {self.model_type} adapter has no Hugging Face name for it")
            out[fqn] = src.take(read, tuple(slice(0, n) for n in shape), tuple(shape))
        return out

    # ---- config ------------------------------------------------------------------------------------

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config.json`` for this model; ``base`` (the config a run started from) keeps its other keys."""
        raise NotImplementedError

    def training_fields(self, hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Keys of ``config.json`` that change training but not the weights (dropout): the meshtrain keys that
        carry them, and a note for each one this family cannot carry (the run trains without it)."""
        dropout = [k for k in ("attention_dropout", "hidden_dropout", "dropout") if float(hf.get(k) or 0.0) > 0]
        notes = [
            f"config.json {k}={hf[k]}: meshtrain's {self.model_type} has no dropout; it trains without" for k in dropout
        ]
        return {}, notes

    def stored_fields(self, hf: Mapping[str, Any], stored: Collection[str]) -> dict[str, Any]:
        """Model keys the folder's tensors decide (``stored``: their names), not config.json alone: DeepSeek-V3's
        MTP modules, which config.json names but transformers does not save. None here."""
        return {}

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """The meshtrain model keys ``config.json`` fixes (explicit values, no 0-means-default); raises
        ``HFConfigError`` for what the family cannot represent."""
        raise NotImplementedError

    def check_model_type(self, hf: Mapping[str, Any]) -> None:
        found = hf.get("model_type")
        if found != self.model_type:
            raise HFConfigError(
                f"config.json has model_type={found!r}, not {self.model_type!r}: it is not a checkpoint of this "
                "model family; choose the model (family) it was saved from"
            )


#: config.json keys a run started from must not pass on (the export writes fp32 with this transformers)
STALE_KEYS = ("torch_dtype", "dtype", "transformers_version")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def over_base(cfg: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """``cfg`` over the config.json a run started from (its other keys kept; its token ids, else none: a
    family's default ids need not exist in this vocabulary)."""
    base = {k: v for k, v in (base or {}).items() if k not in STALE_KEYS}
    return {**{k: None for k in TOKEN_IDS}, **base, **cfg, "dtype": "float32"}


def read_keys(call: Callable[[Mapping[str, Any]], Any], hf: Mapping[str, Any]) -> Any:
    """``call(hf)`` (an adapter's ``model_config`` or ``training_fields``), with a config.json whose keys are missing
    or hold another type than transformers writes refused as ``HFConfigError`` naming the key or the value."""
    try:
        return call(hf)
    except HFConfigError:
        raise
    except KeyError as exc:
        raise HFConfigError(
            f"config.json has no {exc.args[0]!r}, which a {hf.get('model_type')} config.json holds; the file is "
            "incomplete: copy or download it again"
        ) from None
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise HFConfigError(
            f"config.json holds a value of another type than transformers writes ({type(exc).__name__}: {exc}); the "
            "file is damaged: copy or download it again"
        ) from None


def unsupported(problems: list[str]) -> None:
    """Raise one ``HFConfigError`` listing every key a family cannot represent (nothing when there are none)."""
    if problems:
        raise HFConfigError("; ".join(problems))


def first(hf: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` present (and not null) in ``hf``: configs written by different transformers versions
    name some fields differently."""
    for key in keys:
        if hf.get(key) is not None:
            return hf[key]
    return default
