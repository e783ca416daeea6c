"""``ModelSpec``: everything meshtrain needs to know about a model family, in one place. No torch import.

Validation, the strategies and the planner ask a model's spec instead of testing its config for keys:

- ``config``: the config dataclass its YAML extends (frozen for the built-in families, whose modules take it as their
  one argument: ``typed`` makes it of a composed node's values, ``build`` the module); validation also checks a user's
  model config against it;
- ``family`` / ``builder``: its name and the import path of the ``nn.Module`` class, taken from its config's
  ``family`` and ``_target_`` (written once, there);
- ``parallelize``: ``"module:function"`` of its tensor-parallel plan, imported only when tp > 1; ``None``
  means the family cannot run with tp > 1 (validation refuses it before spawn);
- ``pipeline``: how the model splits into pipeline units (the parts before the blocks, the blocks in
  ``layers``, the parts after); ``None`` means it cannot be pipelined;
- ``blocks``: the number of splittable blocks, from the config; ``max_seq_len``: the longest sequence it takes;
- ``shape``: parameter and FLOP formulas (``models/shape.py``), for the planner, the memory check and MFU;
- ``check`` / ``tp_check``: what the config's sizes must satisfy, alone and for a tensor-parallel degree;
  each returns the problems as "key=value: what is wrong; the fix";
- ``inputs`` / ``data_check``: what the model consumes (tokens or images) and needs of the data config;
- ``hf_adapter``: ``"module:OBJECT"`` of its Hugging Face adapter (``models/hf_adapter.py``), imported only
  when a run reads or writes a transformers model folder; ``None``: no way in or out;
- ``loss``: ``"module:function"`` of the loss it trains with (``models/losses.py``), which every engine calls;
- ``tp_plan``: the module names its tensor-parallel plan shards (``TPPlan``), read by its ``parallelize``;
- ``moe``: a mixture of experts' parameter names and sizes (``MoESpec``), for expert parallel and the planner;
  ``None``: a dense model.

The built-in families register in ``models/registry.py``; a user's model registers itself with
``models.registry.register(spec)`` or is named by ``model.spec: "package.module:SPEC"`` in its YAML
(docs/models.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from models.shape import ModelShape

#: keys of a model config that describe the model to meshtrain, not arguments of its builder
META_KEYS = (
    "name",
    "family",
    "spec",
    "init_device",
    "init_from",
    "planner_only",
    "global_batch_size",
    "source",
    "lora",
    "backend",
)

INIT_DEVICES = ("auto", "cpu", "meta")
#: ``model.backend``: who runs a model folder's architecture (``trainer/hf/start.py``)
BACKENDS = ("auto", "native", "transformers")


class ConfigReads:
    """Read access by key (``get``, ``[key]``, ``in``) on a typed config, so a family's rules (``ModelSpec.check``,
    ``shape`` ...) read a typed config and a plain mapping alike."""

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.keys()

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class LoRAConfig(ConfigReads):
    """``model.lora``: low-rank adapters beside frozen weights (``models/lora.py``; docs/fine-tuning.md)."""

    rank: int = 0
    """Adapter rank; 0: no LoRA, every weight trains."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank."""
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["wq", "wv"])
    """The linear layers that get adapters: module names (``wq``, ``wv``, ``w1`` ...) or FQN patterns
    (``layers.*.attention.wq``)."""


@dataclass(frozen=True)
class ModelArgs(ConfigReads):
    """Keys every model config has. A built-in family's config extends this frozen dataclass and is its module's
    one constructor argument (``GPT(config)``, as torchtitan's ``Transformer(model_args)``): the sizes' defaults live
    here, once. Hydra composes a mutable twin of it (``hydra_schema``); the trainer turns the composed node into this
    typed, frozen object (``ModelSpec.typed``) after validation."""

    _target_: str = "???"
    name: str = "model"
    family: str = ""
    """Which ``ModelSpec`` describes it (``models/registry.py``); empty: found from ``spec`` or ``_target_``."""
    spec: Optional[str] = None
    """``package.module:SPEC`` of a user's ``ModelSpec`` (imported, so it also registers); docs/models.md."""
    init_device: str = "auto"
    """cpu (build the full model on every rank, then shard), meta (build on the meta device, shard or
    split, then materialise and initialise each rank's part), or auto (meta when the full fp32 weights
    exceed the rank's budget: topology.device_memory_gb x planner.memory_fraction)."""
    init_from: Optional[str] = None
    """A Hugging Face model folder (config.json + safetensors) whose weights the run starts from, read by each
    rank for the shards it holds (``ModelSpec.hf_adapter`` maps the names); null: random weights."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (``rank > 0``): only they train; the other weights are frozen."""
    backend: str = "auto"
    """With ``init_from`` alone, who runs the folder's architecture: auto (the native family that reads its
    ``model_type``, else transformers' own modules), native, or transformers (``models/hf_transformers``)."""


class ConfigView(Mapping):
    """A read-only model config without a schema (a user's model that names no config class): its keys as items
    and as attributes, so a family's rules read it as they read a typed config."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"model.{key}: a typed model config is read-only")

    def __reduce__(self):
        return (ConfigView, (self._values,))

    def __repr__(self) -> str:
        return f"ConfigView({self._values!r})"


_SCHEMAS: dict[type, type] = {}


def hydra_schema(cls: type) -> type:
    """The mutable twin of a config dataclass (same fields, types and defaults; nested dataclasses twinned too): what
    Hydra's ConfigStore holds, since a frozen structured config refuses the merges that compose it. A mutable class
    is its own schema."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return cls
    if cls not in _SCHEMAS:
        hints = typing.get_type_hints(cls)
        spec = []
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            extra: dict[str, Any] = {}
            if dataclasses.is_dataclass(kind):
                kind = hydra_schema(kind)
                extra["default_factory"] = kind
            elif f.default is not dataclasses.MISSING:
                extra["default"] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                extra["default_factory"] = f.default_factory
            spec.append((f.name, kind, dataclasses.field(**extra)))
        name = f"{cls.__name__}Schema"
        twin = dataclasses.make_dataclass(
            name, spec, bases=(ConfigReads,), namespace={"__module__": cls.__module__, "__doc__": cls.__doc__}
        )
        setattr(sys.modules[cls.__module__], name, twin)  # importable by name: a composed config pickles
        _SCHEMAS[cls] = twin
    return _SCHEMAS[cls]


#: what a user's own model schema extends (docs/models.md): ``ModelArgs``'s keys, mutable as any Hydra schema
ModelConfig = hydra_schema(ModelArgs)


def make_config(cls: type | None, values: Mapping[str, Any]) -> Any:
    """An instance of the config dataclass ``cls`` from a plain mapping (nested mappings become its nested
    dataclasses); a key ``cls`` does not have is a ``TypeError`` naming it and the keys it has. ``cls`` None (a
    config without a schema): a read-only ``ConfigView`` of the values."""
    if cls is None:
        return ConfigView(values)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"{cls.__name__} has no key(s) {unknown}; its keys: {sorted(known)}")
    kwargs = {}
    for key, value in values.items():
        kind = hints[key]
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            value = make_config(kind, value)
        kwargs[key] = value
    return cls(**kwargs)


def config_or_fields(cls: type, config: Any, fields: Mapping[str, Any]) -> Any:
    """A module's config: ``config`` as given, or one made of keyword ``fields`` (``hydra.utils.instantiate`` of a
    ``model`` node calls the module with its keys); never both."""
    if config is not None and fields:
        raise TypeError(f"give a {cls.__name__} or its fields as keywords, not both (got {sorted(fields)})")
    return config if config is not None else make_config(cls, fields)


#: ``model.balance_scope``: the load-balancing loss's expert counts over every data- and context-parallel rank's
#: micro-batch together, or over one forward's sequences (``models/moe.py``)
BALANCE_SCOPES = ("global", "micro_batch")


@dataclass(frozen=True)
class MoESpec:
    """Where a mixture-of-experts family keeps its experts, for expert parallel (which shards them over ``ep``) and
    the planner (which counts them). Patterns are FQNs with ``*`` for the layer key (``fnmatch``); the sizes are
    functions of the model config, as ``ModelSpec.blocks``."""

    experts: tuple[str, ...]
    """The stacked expert weights, dim 0 indexing the expert (``layers.*.feed_forward.experts.w1`` ...)."""
    router: tuple[str, ...] = ()
    """The router weights (replicated over ``ep``: every rank routes its own tokens)."""
    n_experts: Callable[[Any], int] | None = None
    """Routed experts per sparse layer, from the config."""
    top_k: Callable[[Any], int] | None = None
    """Experts each token runs through, from the config."""

    def is_expert(self, fqn: str) -> bool:
        """Whether parameter ``fqn`` is an expert weight (a pipeline stage's or a wrapper's prefix allowed)."""
        from fnmatch import fnmatch

        return any(fnmatch(fqn, p) or fnmatch(fqn, f"*.{p}") for p in self.experts)


@dataclass(frozen=True)
class PipelineUnits:
    """How a model splits into stages: ``pre`` parts (first stage), the blocks in ``layers``, ``post`` parts.

    ``None`` for ``pre`` / ``post`` means: the model's top-level children before / after ``layers``, in
    the order the module defines them. Every named part must be a top-level child that ``forward`` skips
    when it is set to ``None``.
    """

    pre: tuple[str, ...] | None = None
    post: tuple[str, ...] | None = None


Problems = list[str]


# ---- the tensor-parallel plan's module names (torch-free; models/tensor_parallel.py applies them) ----------


@dataclass(frozen=True)
class SubBlockTP:
    """One sub-block of a decoder block under Megatron's split, by names relative to the block (``layers.N``):
    the norm before it, the projections that fan out (column-wise) and the one that fans back in (row-wise)."""

    module: str
    """The sub-block (``attention``, ``feed_forward``): with sequence parallel its input is gathered."""
    norm: str
    """The norm on the residual stream before it (``attention_norm``): runs on the sequence shard."""
    colwise: tuple[str, ...]
    """Its input projections, relative to ``module`` (``wq``, ``wk``, ``wv``): split by output columns."""
    rowwise: str
    """Its output projection, relative to ``module`` (``wo``): split by input rows, partial sums reduced."""
    head_norms: tuple[str, ...] = ()
    """Norms applied per head inside it, relative to ``module`` (Qwen3's ``q_norm``, ``k_norm``): their input
    is sharded over the heads dimension, their weights replicated."""
    extra_inputs: int = 0
    """Inputs it takes after the residual stream, passed as plain tensors (Llama's rotary table: 1)."""
    replicated: tuple[str, ...] = ()
    """Plain modules inside it, relative to ``module``, that read its (replicated) input whole on every tp rank
    (MLA's down-projections ``wq_a``, ``wkv_a``): with sequence parallel their input arrives as the local tensor.
    Their gradients are full on every rank when what follows them is column-wise (or ``shared``)."""
    shared: tuple[str, ...] = ()
    """Modules inside it, relative to ``module``, whose output every tp rank uses for its own heads (MLA's rotary
    key, one head shared by all): the output's gradient, each rank's heads' part, is summed over tp in backward
    (Megatron's copy to the tensor-parallel region)."""
    whole_if: str = ""
    """A submodule name, relative to ``module``, that marks a block where this sub-block has no split: it runs
    whole on every tp rank, its projections are not read (a mixture of experts, marked by its ``router``:
    ``models/tensor_parallel.py`` says why). Empty: the sub-block is always split."""

    def is_whole(self, block: str, present: Collection[str]) -> bool:
        """Whether block ``block`` (``layers.N``) runs this sub-block whole: its marker is among ``present``."""
        return bool(self.whole_if) and f"{block}.{self.module}.{self.whole_if}" in present


@dataclass(frozen=True)
class TPPlan:
    """The FQNs a family's tensor-parallel plan shards, and how: what ``models/tensor_parallel.py`` reads
    instead of assuming names. Blocks live in ``layers``; a pipeline stage may lack ``final_norm`` and ``head``."""

    sub_blocks: tuple[SubBlockTP, ...]
    final_norm: str = "norm"
    """The norm after the last block: on the sequence shard with sequence parallel; a stage without it ends
    before the model's end, so its last block gathers the sequence back."""
    head: str = "output"
    """The output projection: column-wise over the vocabulary (kept sharded with ``tp.loss_parallel``)."""
    embedding: str = "tok_embeddings"
    """The token embedding: replicated, unless the model ties it to the head (its ``tie_embeddings``); then it is
    split over the vocabulary as the head is (``Shard(0)``), so the two are one weight with one placement."""
    block_extra_inputs: int = 0
    """Inputs a block takes after the residual stream (Llama's rotary table: 1)."""

    def block_modules(self, block: str, *, present: Collection[str] = ()) -> list[str]:
        """Every submodule name the plan reads in block ``block`` (``layers.0``), in plan order; ``present``: the
        model's module names, where a sub-block's ``whole_if`` marker is looked for (its marker is read instead
        of its projections)."""
        names = []
        for sub in self.sub_blocks:
            whole = sub.is_whole(block, present)
            inner = (
                [sub.whole_if] if whole else [*sub.colwise, sub.rowwise, *sub.head_norms, *sub.replicated, *sub.shared]
            )
            names += [f"{block}.{sub.norm}", f"{block}.{sub.module}", *(f"{block}.{sub.module}.{n}" for n in inner)]
        return names

    def module_names(self, blocks: Sequence[str], *, present: Collection[str] = ()) -> list[str]:
        """Every FQN the plan reads in a model whose ``layers`` holds ``blocks`` (keys "0", "1" ...)."""
        names = [n for key in blocks for n in self.block_modules(f"layers.{key}", present=present)]
        return [*names, self.final_norm, self.head]


def decoder_tp_plan(
    *, ffn_in: tuple[str, ...], extra_inputs: int = 0, head_norms: tuple[str, ...] = (), ffn_whole_if: str = ""
) -> TPPlan:
    """The plan over the module names the built-in decoders share (``attention.wq`` ... ``feed_forward.w2``,
    ``attention_norm``, ``ffn_norm``, ``norm``, ``output``): their feed-forward's input projections, the inputs
    after the residual stream, per-head norms, and the marker of a feed-forward run whole on every tp rank (a
    mixture of experts' ``router``) are what differ."""
    return TPPlan(
        sub_blocks=(
            SubBlockTP(
                module="attention",
                norm="attention_norm",
                colwise=("wq", "wk", "wv"),
                rowwise="wo",
                head_norms=head_norms,
                extra_inputs=extra_inputs,
            ),
            SubBlockTP(module="feed_forward", norm="ffn_norm", colwise=ffn_in, rowwise="w2", whole_if=ffn_whole_if),
        ),
        block_extra_inputs=extra_inputs,
    )


@dataclass(frozen=True)
class ModelSpec:
    family: str
    builder: str
    """Import path of the module class: ``package.module.Class`` (the ``_target_`` of its configs)."""
    config: type | None = None
    schemas: dict[str, type] | None = None
    """ConfigStore names of the family's schemas (``gpt_schema`` ...); ``None``: just ``config``."""
    parallelize: str | None = None
    """``package.module:function`` applying the tensor-parallel plan: ``fn(model, *, tp_mesh,
    sequence_parallel, loss_parallel) -> model``; the decoder families share ``DECODER_PARALLELIZE`` over their
    ``tp_plan``."""
    takes_config: bool = False
    """The module is built as ``builder(config)``, its typed config its one argument (the built-in decoders, as
    torchtitan's ``Transformer(model_args)``); False: ``builder(**keys)`` (a user's model)."""
    pipeline: PipelineUnits | None = PipelineUnits()
    blocks: Callable[[Any], int] | None = None
    max_seq_len: Callable[[Any], int] | None = None
    """The longest sequence the model takes (position table, rotary table); None: any length."""
    shape: Callable[[Any], ModelShape] | None = None
    check: Callable[[Any], Problems] | None = None
    tp_check: Callable[[Any, int], Problems] | None = None
    hf_adapter: str | None = None
    """``package.module:OBJECT``, the family's ``models.hf_adapter.HFAdapter``: names, tensors and config
    between meshtrain and a transformers model folder (``model.init_from``, ``python -m trainer.export``)."""
    description: str = ""
    # ---- what validation asks of the family (trainer/validate.py reads these; no key guesses the family) ----
    inputs: str | None = "tokens"
    """What the model consumes: ``tokens`` (data=text, data=tokens) or ``images`` (data=images); None: not checked."""
    data_check: Callable[[Any, Any], Problems] | None = None
    """``fn(model, data)``: what the model needs of the data config (the CNN: images big enough for its pooling)."""

    # -- what the family trains with, and the names its tensor-parallel plan shards (both read by the strategies)
    loss: str = "models.losses:token_cross_entropy"
    """``package.module:function`` of its loss, ``fn(output, targets, *, reduction="mean"|"sum")`` (``models/losses.py``)."""
    tp_plan: TPPlan | None = None
    """The module names its ``parallelize`` function shards; ``None`` for a family without tensor parallel."""
    sequence_parallel: bool = True
    """Its ``parallelize`` can shard the residual stream over the sequence (``tp.sequence_parallel``); False: validation
    refuses that key with this family."""
    context_parallel: bool = False
    """Its attention modules call ``self.attend`` and its top-level module has a ``seq_chunk`` (models/attention.py):
    context parallel (``cp.size``) can split its sequence."""
    cp_check: Callable[[Any, int, int], Problems] | None = None
    """``fn(model, cp, seq_len)``: what the architecture's attention needs for ``cp.size`` at ``data.seq_len``
    beyond whole heads per rank (the Hugging Face backend: no sliding window shorter than the sequence)."""
    moe: MoESpec | None = None
    """A mixture of experts' expert FQN patterns, ``n_experts`` and ``top_k`` (expert parallel, the planner);
    ``None``: a dense model."""
    # ---- the planner's model (calibration and dry run) ----
    resized: Callable[[Any, dict[str, int]], dict[str, Any]] | None = None
    """``fn(model, sizes) -> kwargs``: builder kwargs of a model of this family like the config ``model`` with
    ``sizes`` (``n_layers``, ``vocab_size``, ``max_seq_len``; absent keys kept) replaced, so the planner times
    and dry-runs the configured family; None: the planner cannot build it (it plans from the config alone)."""

    def loss_fn(self) -> Callable[[Any, Any], Any]:
        """The loss function (imported on first use: it imports torch)."""
        return import_object(self.loss)

    @classmethod
    def of(cls, config: type, *, schemas: dict[str, type] | None = None, **fields: Any) -> ModelSpec:
        """A family's spec from its config schema: the family name and builder are the config's ``family`` and
        ``_target_`` (defined there once); its schema is registered as ``<family>_schema`` unless ``schemas``
        names more."""
        family = str(config.family)
        return cls(
            family=family,
            builder=str(config._target_),
            config=config,
            schemas=schemas or {f"{family}_schema": config},
            **fields,
        )

    @classmethod
    def decoder(cls, config: type, **fields: Any) -> ModelSpec:
        """A dense decoder's spec (``of``): its blocks counted by ``n_layers``, its longest sequence
        ``max_seq_len``, its pipeline units the token embedding, the blocks, the final norm and the head,
        unless ``fields`` says otherwise."""
        defaults = {
            "blocks": n_layers,
            "max_seq_len": configured_max_seq_len,
            "pipeline": DECODER_UNITS,
            "parallelize": DECODER_PARALLELIZE,
            "takes_config": True,
        }
        return cls.of(config, **{**defaults, **fields})

    def parallelize_fn(self) -> Callable[..., Any]:
        """The tensor-parallel plan function (imported on first use: it imports torch); the decoders' shared one
        comes bound to this family's ``tp_plan``."""
        if self.parallelize is None:
            raise ValueError(f"model family '{self.family}' has no tensor-parallel plan (ModelSpec.parallelize)")
        fn = import_object(self.parallelize)
        return functools.partial(fn, plan=self.tp_plan) if self.parallelize == DECODER_PARALLELIZE else fn

    def typed(self, values: Mapping[str, Any]) -> Any:
        """The typed model config of the plain mapping ``values`` (a composed ``model`` node, resolved): an instance
        of the family's ``config`` dataclass (frozen for the built-in families), or a read-only ``ConfigView`` for a
        model without a schema."""
        if self.config is None:
            return make_config(None, values)
        # the first of its schemas holding every key (a description for the planner has keys of its own)
        for schema in dict.fromkeys((self.config, *(self.schemas or {}).values())):
            if set(values) <= {f.name for f in dataclasses.fields(schema)}:
                return make_config(schema, values)
        return make_config(self.config, values)  # names the keys it lacks

    def build(self, config: Any) -> Any:
        """The module (on the current default device): ``builder(config)`` for a family that takes its config,
        else ``target(**keys)`` where ``target`` is the config's ``_target_`` (a user's module)."""
        if not dataclasses.is_dataclass(config):
            config = self.typed(config)
        target = str(config.get("_target_") or self.builder)
        if self.takes_config and target == self.builder:
            return import_object(target)(config)
        return import_object(target)(**{k: v for k, v in builder_kwargs(config).items() if k != "_target_"})

    def hf_adapter_obj(self) -> Any:
        """The Hugging Face adapter (imported on first use)."""
        if self.hf_adapter is None:
            raise ValueError(
                f"model family '{self.family}' has no Hugging Face adapter (ModelSpec.hf_adapter): its weights cannot "
                "be read from or written to a transformers model folder; a family gets one with ModelSpec.hf_adapter "
                "(docs/models.md, 'Hugging Face in and out')"
            )
        return import_object(self.hf_adapter)

    def n_blocks(self, model: Any) -> int | None:
        return self.blocks(model) if self.blocks is not None else None

    def problems(self, model: Any) -> Problems:
        return list(self.check(model)) if self.check is not None else []

    def data_problems(self, model: Any, data: Any) -> Problems:
        return list(self.data_check(model, data)) if self.data_check is not None else []

    def tp_problems(self, model: Any, tp: int) -> Problems:
        if self.parallelize is None:
            return [
                f"tp.size={tp} with model.name={model.get('name', self.family)}: the model family '{self.family}' has "
                "no tensor-parallel plan (ModelSpec.parallelize; the decoders share models/tensor_parallel.py's "
                "parallelize_decoder over their ModelSpec.tp_plan); use tp.size=1 with parallel=ddp or fsdp, or give its ModelSpec a "
                "parallelize function (docs/models.md)"
            ]
        return list(self.tp_check(model, tp)) if self.tp_check is not None else []


def n_layers(model: Any) -> int:
    """``ModelSpec.blocks`` of a model whose config counts its blocks in ``n_layers``."""
    return int(model.n_layers)


def configured_max_seq_len(model: Any) -> int:
    """``ModelSpec.max_seq_len`` of a model whose config holds it in ``max_seq_len``."""
    return int(model.max_seq_len)


#: pipeline units of a decoder with a token embedding, its blocks in ``layers``, a final norm and a head
DECODER_UNITS = PipelineUnits(pre=("tok_embeddings",), post=("norm", "output"))

#: the one tensor-parallel function of the decoder families: Megatron's plan over each family's ``tp_plan``
DECODER_PARALLELIZE = "models.tensor_parallel:parallelize_decoder"


def import_object(path: str) -> Any:
    """``package.module:attr`` (or ``package.module.attr``) -> the object."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def config_values(model: Any) -> dict[str, Any]:
    """A model config's keys and plain values (a typed config's nested dataclasses as dicts), every key kept."""
    return dataclasses.asdict(model) if dataclasses.is_dataclass(model) else dict(model)


def builder_kwargs(model: Any) -> dict[str, Any]:
    """A model config without the keys that are for meshtrain (``family``, ``spec``, ``init_device`` ...)."""
    return {k: v for k, v in config_values(model).items() if k not in META_KEYS}


# ---- shared checks of decoder transformers ------------------------------------------------------


def size_problems(model: Any, *, positive: Sequence[str], non_negative: dict[str, str] | None = None) -> Problems:
    """Sizes the constructor would reject: ``positive`` keys must be >= 1, ``non_negative`` keys >= 0 (their
    value says what 0 means)."""
    out: Problems = []
    for key in positive:
        if key in model and int(model[key]) < 1:
            out.append(f"model.{key}={model[key]}: must be a positive integer (>= 1)")
    for key, zero in (non_negative or {}).items():
        if key in model and int(model[key] or 0) < 0:
            out.append(f"model.{key}={model[key]}: must be >= 0 ({zero})")
    return out


INIT_RULES = ("reference", "normal")
"""``model.init`` of the decoder families (``models/init.py`` draws them)."""


def init_problems(model: Any) -> Problems:
    init = model.get("init", "reference")
    if init not in INIT_RULES:
        return [f"model.init={init}: use one of {', '.join(INIT_RULES)} (reference: the family's published rule)"]
    return []


def transformer_problems(model: Any, *, kv_heads: bool = False) -> Problems:
    """Heads divide the width; with grouped-query attention, key/value heads divide the query heads."""
    out: Problems = []
    heads, d_model = int(model.n_heads), int(model.d_model)
    if heads < 1 or d_model % heads:
        out.append(
            f"model.d_model={d_model} is not divisible by model.n_heads={heads}; choose heads dividing {d_model}"
        )
    if kv_heads:
        kv = int(model.get("n_kv_heads") or 0) or heads
        if kv < 1 or heads % kv:
            ok = [d for d in range(1, heads + 1) if heads % d == 0]
            out.append(
                f"model.n_kv_heads={kv} does not divide model.n_heads={heads}: each key/value head serves a whole "
                f"group of query heads; use model.n_kv_heads in {ok}"
            )
    return out


def transformer_tp_problems(model: Any, tp: int, *, widths: Sequence[int], kv_heads: bool = False) -> Problems:
    """What a Megatron-style plan (column-wise q/k/v and MLP in, row-wise out) needs from the sizes."""
    out: Problems = []
    heads, d_model = int(model.n_heads), int(model.d_model)
    if heads % tp:
        out.append(
            f"model.n_heads={heads} is not divisible by tp.size={tp}: each tp rank owns whole attention heads; "
            f"use a tp.size dividing {heads}"
        )
    if kv_heads:
        kv = int(model.get("n_kv_heads") or 0) or heads
        if kv % tp:
            ok = [d for d in range(1, kv + 1) if kv % d == 0]
            out.append(
                f"model.n_kv_heads={kv} is not divisible by tp.size={tp}: wk/wv are split by key/value heads, "
                f"so each tp rank needs whole ones; use tp.size in {ok} (or more key/value heads)"
            )
    if d_model % tp:
        out.append(
            f"model.d_model={d_model} is not divisible by tp.size={tp}: wq/wk/wv/wo are split by columns; "
            f"use a model.d_model that is a multiple of {tp}"
        )
    for width in sorted(set(int(w) for w in widths)):
        if width % tp:
            out.append(
                f"feed-forward width {width} (model.d_ff / model.layer_d_ff) is not divisible by tp.size={tp}: "
                f"the MLP matrices are split by it; use a multiple of {tp}"
            )
    return out


# ---- where the weights are first made -------------------------------------------------------------


def resolve_init_device(requested: str, *, full_fp32_bytes: float | None, budget_bytes: float) -> str:
    """``cpu`` or ``meta`` for ``model.init_device`` (``auto``: meta when the full fp32 weights would not fit)."""
    if requested != "auto":
        return requested
    if full_fp32_bytes is None:
        return "cpu"
    return "meta" if full_fp32_bytes > budget_bytes else "cpu"
