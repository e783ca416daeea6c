"""The model families meshtrain knows: family name -> ``ModelSpec``. No torch import.

Validation, the strategies and the planner find a model config's spec with ``spec_for(model)``:

1. ``model.spec: "package.module:SPEC"`` names a ``ModelSpec`` object (a user's model; importing the
   module is enough, nothing in meshtrain is edited);
2. else ``model.family`` names a registered family (the built-in ones below, or one added with ``register``);
3. else a registered spec whose ``builder`` is the config's ``_target_``;
4. else a generic spec: any ``nn.Module`` runs under single, ddp and fsdp, and under pp when its blocks
   live in ``layers``; no tensor-parallel plan, no planner formulas.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from models.shape import ModelShape, PlanError
from models.spec import ModelSpec, PipelineUnits, hydra_schema, import_object, make_config

REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add (or replace) a family; returns the spec, so ``SPEC = register(ModelSpec(...))`` reads well."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register() takes a models.spec.ModelSpec, not {type(spec).__name__}")
    REGISTRY[spec.family] = spec
    return spec


#: the built-in families: adding one is its folder models/<family>/, its conf/model/*.yaml and one line here
BUILT_IN = (
    "models.gpt.spec:SPEC",
    "models.llama.spec:SPEC",
    "models.qwen3.spec:SPEC",
    "models.qwen3_moe.spec:SPEC",
    "models.deepseek_v3.spec:SPEC",
    "models.cnn.spec:SPEC",
    "models.hf_transformers.spec:SPEC",
)
for _path in BUILT_IN:
    register(import_object(_path))


def model_schemas() -> dict[str, type]:
    """Schema name in ConfigStore's ``model`` group -> dataclass, for every family registered now
    (conf/model/*.yaml extend one of these; conf/schema.py stores them): the mutable twin of each family's frozen
    config (``hydra_schema``), which Hydra's merges can fill."""
    return {name: hydra_schema(schema) for spec in REGISTRY.values() for name, schema in (spec.schemas or {}).items()}


def generic_spec(target: str) -> ModelSpec:
    return ModelSpec(family="custom", builder=target, pipeline=PipelineUnits())


class UnknownModel(ValueError):
    """``model.spec`` or ``model.family`` names nothing; the message says what exists."""


def spec_for(model: Any) -> ModelSpec:
    """The ``ModelSpec`` describing the model config ``model`` (typed, a mapping, or a composed node)."""
    path = model.get("spec")
    if path:
        try:
            spec = import_object(str(path))
        except (ImportError, AttributeError, ValueError) as exc:
            raise UnknownModel(
                f"model.spec={path}: cannot import it ({type(exc).__name__}: {exc}); give 'package.module:NAME' "
                "of a ModelSpec on the Python path (docs/models.md)"
            ) from None
        if not isinstance(spec, ModelSpec):
            raise UnknownModel(f"model.spec={path} is a {type(spec).__name__}, not a models.spec.ModelSpec")
        return spec
    family = model.get("family")
    if family:
        if family not in REGISTRY:
            raise UnknownModel(
                f"model.family={family}: unknown model family; registered: {', '.join(sorted(REGISTRY))} "
                "(a model of your own: set model.spec, docs/models.md)"
            )
        return REGISTRY[family]
    target = str(model.get("_target_", ""))
    for spec in REGISTRY.values():
        if spec.builder == target:
            return spec
    return generic_spec(target)


def spec_or_none(model: Any) -> ModelSpec | None:
    """The model's family spec, or None for a name the registry does not know (validation's model check says so)."""
    try:
        return spec_for(model)
    except UnknownModel:
        return None


def typed_model(values: Any) -> Any:
    """The model's own config from its plain values (a composed ``model`` node, resolved): its family's frozen
    dataclass (``ModelSpec.typed``); a model no spec knows, or one its schema refuses, is a read-only ``ConfigView``
    (validation names the problem). The one place a model config is typed: the trainer's and the planner's command
    line's plain values come here."""
    try:
        return spec_for(values).typed(values)
    except (UnknownModel, TypeError):
        return make_config(None, values)  # a read-only ConfigView


def model_shape(model: Any) -> ModelShape:
    """The shape of the model config ``model`` from its family's ``ModelSpec``; ``PlanError`` when it has no formulas."""
    spec = spec_for(model)
    if spec.shape is None:
        raise PlanError(
            f"model={model.get('name', '?')}: the model family '{spec.family}' has no parameter/FLOP "
            "formulas (ModelSpec.shape), so the planner cannot describe it; choose model=gpt_small, "
            "model=llama_debug or another transformer, or give its ModelSpec a shape function"
        )
    rowwise = tuple(s.rowwise for s in spec.tp_plan.sub_blocks) if spec.tp_plan is not None else ()
    shape = spec.shape(model)
    # MTP modules read targets past a rank's chunk of the sequence: validation refuses context parallel with them;
    # so does the family's cp_check (at the model's context length: the planner proposes no layout it would refuse)
    refused = spec.cp_check is not None and bool(spec.cp_check(model, 2, shape.max_seq_len))
    splits_sequences = spec.context_parallel and not shape.mtp_depth and not refused
    shape = replace(shape, context_parallel=splits_sequences, rowwise_linears=rowwise)
    lora = model.get("lora")
    rank = int(lora.get("rank") or 0) if lora else 0
    if rank <= 0:
        return shape
    return replace(shape, lora_rank=rank, lora_targets=tuple(str(t) for t in lora.get("targets") or ()))


def planner_model(values: Any) -> tuple[Any, ModelShape | None, str | None]:
    """A model's plain values as the planner reads them, looked up once: its typed config (``typed_model``), its
    shape (``model_shape``) and, where the planner cannot describe it (no formulas: shape None), why."""
    model = typed_model(values)
    try:
        return model, model_shape(model), None
    except PlanError as exc:
        return model, None, str(exc)
