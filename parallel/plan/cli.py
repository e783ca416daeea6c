"""``python -m parallel.plan [OVERRIDES] [--top N] [--json] [--dry-run]``: rank layouts for a model on a topology.

Composes conf/ with Hydra-style overrides exactly as train.py does (``model=gpt_175b
topology=cluster_1024xh100 planner.recompute=any``), starts no worker, needs no GPU and imports no torch
(unless ``topology.calibrate=true`` asks to measure this machine, or ``--dry-run`` builds the first choice
for sampled ranks under torch's fake process group: ``parallel/plan/dry_run.py``).

The one module of ``parallel/`` and ``models/`` that reads a composed config (tests/unit/test_config_stops.py): it
parses the command line, types the sections the planner reads (``specs_from_cfg``) and hands those objects to the
planner's door (``parallel/plan/api.py``); the tables it prints are ``parallel/plan/tables.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from conf.command_line import shell_expanded
from models.hf_family import hf_model
from models.objectives import holds_reference
from models.registry import UnknownModel, planner_model, typed_model
from models.spec import hydra_schema, make_config
from parallel.config import PlannerConfig, TopologyConfig
from parallel.foundation import dims
from parallel.plan.api import CONF, Inputs, PlannerRequest, planner_inputs
from parallel.plan.cost_model import DISPATCHES, Candidate, estimate
from parallel.plan.search import plan
from parallel.plan.specs import PlanError
from parallel.plan.tables import (
    gpu_hours_per_trillion_tokens,
    plan_json,
    print_cost_lines,
    print_dry_run,
    print_table,
)


def workload_overrides(overrides: list[str]) -> list[str]:
    """``data.seq_len=N`` / ``data.global_batch_size=N`` written on the command line also set ``planner.*`` (unless
    those are written too): a model describing a published run (llama3_8b ...) otherwise plans with that run's
    sequence and batch, and ``python -m parallel.plan model=llama3_8b data.seq_len=131072`` means 128k tokens."""
    given = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}
    extra = [
        f"planner.{key}={given[f'data.{key}']}"
        for key in ("seq_len", "global_batch_size")
        if f"data.{key}" in given and f"planner.{key}" not in given
    ]
    return [*overrides, *extra]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=workload_overrides(overrides))


def composed(overrides: list[str]):
    """``compose``, with a command line Hydra refuses, or a key nothing reads (``+paralel=fsdp``), raised as
    PlanError with the nearest key (conf/keys.py), as train.py refuses them."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from conf.keys import append_hint, unread_problems

    try:
        cfg = compose(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        hint = append_hint(str(exc))
        raise PlanError(f"{exc}".strip() + (f"\n{hint}" if hint else "")) from None
    problems = unread_problems(cfg)
    if problems:
        raise PlanError("; ".join(problems))
    return cfg


def model_from_folder(cfg: Any, overrides: list[str]) -> None:
    """``model.init_from=DIR`` without a ``model=``: the model DIR's config.json describes replaces the default one,
    as training takes it (``models.hf_family.hf_model``; trainer/hf/start.py), the command line's ``model.*`` over it.
    Raises PlanError naming the folder and why (no config.json, a model_type no family reads)."""
    start = OmegaConf.select(cfg, "model.init_from")
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    if not start or "model" in keys:
        return
    try:
        hf = json.loads((Path(str(start)).expanduser() / "config.json").read_text())
    except (OSError, ValueError) as exc:
        msg = f"model.init_from={start}: no readable config.json ({exc}); give a Hugging Face model folder"
        raise PlanError(msg) from None
    try:
        spec, values, _ = hf_model(hf, start=str(start), backend=str(OmegaConf.select(cfg, "model.backend") or "auto"))
    except UnknownModel as exc:
        raise PlanError(str(exc)) from None
    except ValueError as exc:  # the adapter's HFConfigError
        raise PlanError(f"model.init_from={start}: {exc}") from None
    model = OmegaConf.merge(OmegaConf.structured(hydra_schema(spec.config)), values)
    if "max_seq_len" not in values and "max_seq_len" in model:
        model.max_seq_len = "${data.seq_len}"
    for key in (k[len("model.") :] for k in keys if k.startswith("model.") and k != "model.init_from"):
        OmegaConf.update(model, key, OmegaConf.select(cfg.model, key), merge=False, force_add=True)
    cfg.model = model


# ---- the one place the planner reads a composed config: it hands typed objects to parallel/plan/api.py ---------


def plain(node: Any) -> dict[str, Any]:
    """A composed config section's plain values, resolved."""
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def typed_section(cls: type, node: Any) -> Any:
    """A composed config section as its schema's dataclass (``TopologyConfig``, ``PlannerConfig``)."""
    return make_config(cls, plain(node))


def specs_from_cfg(cfg: Any, *, calibrate: bool | None = None) -> Inputs:
    """Model, hardware (measured when ``topology.calibrate``) and workload of a composed config."""
    data = cfg.get("data") or {}
    trainer = cfg.get("trainer")
    model, shape, problem = planner_model(plain(cfg.model))
    request = PlannerRequest(
        model_config=model,
        model_shape=shape,
        shape_problem=problem,
        topology=typed_section(TopologyConfig, cfg.topology),
        planner=typed_section(PlannerConfig, cfg.planner),
        global_batch_size=int(data.get("global_batch_size") or 0),
        seq_len=int(data.get("seq_len") or 0),
        trainer_precision=str(trainer.precision) if trainer is not None else None,
        optim=plain(cfg.optim) if cfg.get("optim") is not None else None,
        reference_copy=trainer is not None
        and holds_reference(str(trainer.objective), str(trainer.preference.reference)),
    )
    return planner_inputs(request, calibrate=calibrate)


def layout_candidate(text: str) -> Candidate:
    """``--layout "dp=128 pp=16 ep=64 zero=1 m=120 schedule=1f1b"`` as a ``Candidate`` (the degrees by their
    dimension names; ``m``: micro-batches; ``zero``: 0-3; ``schedule``, ``recompute``, ``v``: stages per rank;
    ``sp``: sequence parallel 0/1; ``dispatch``: expert parallel's, ``flat`` or ``node_limited``)."""
    fields = {"m": "micro_batches", "zero": "zero_stage", "schedule": "schedule", "recompute": "recompute",
              "v": "stages_per_rank", "sp": "sequence_parallel", "dispatch": "dispatch"}  # fmt: skip
    sizes: dict[str, int] = {}
    kwargs: dict[str, Any] = {}
    for item in text.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep or (key not in fields and key not in dims.names()):
            raise PlanError(
                f"--layout {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join([*dims.names(), *fields])}"
            )
        if key in dims.names():
            sizes[key] = int(value)
        elif key == "dispatch" and value not in DISPATCHES:
            raise PlanError(f"--layout {text!r}: dispatch={value}; use one of {', '.join(DISPATCHES)}")
        elif key in ("schedule", "recompute", "dispatch"):
            kwargs[fields[key]] = value
        else:
            kwargs[fields[key]] = bool(int(value)) if key == "sp" else int(value)
    if kwargs.get("schedule") is None:
        kwargs["schedule"] = "1f1b" if sizes.get("pp", 1) > 1 else "none"
    return Candidate(sizes=sizes, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parallel.plan", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=gpt_175b topology=cluster_1024xh100")
    parser.add_argument("--top", type=int, default=None, help="candidates to show (default planner.top)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the first choice for sampled ranks under torch's fake process group and measure its memory",
    )
    parser.add_argument(
        "--layout",
        default=None,
        help='also price this layout, e.g. "dp=128 pp=16 ep=64 zero=1 m=120 schedule=1f1b" (a published run\'s); '
        "with --dry-run it is the one built",
    )
    parser.add_argument(
        "--reference-gpu-hours",
        type=float,
        default=None,
        help="a published GPU-hours per trillion tokens to print the estimates' ratios against",
    )
    args = parser.parse_args(argv)
    args.overrides = shell_expanded(args.overrides)  # key=~/path as a shell expands a path
    t0 = time.perf_counter()
    try:
        cfg = composed(args.overrides)
        model_from_folder(cfg, args.overrides)
        top = args.top if args.top is not None else int(cfg.planner.top)
        model, hardware, workload = specs_from_cfg(cfg)
        result = plan(model=model, hardware=hardware, workload=workload)
        if not result.ranked:
            _ = result.best  # raises PlanError naming the budget and the fix
        layout = None
        if args.layout:
            layout = estimate(layout_candidate(args.layout), model=model, hardware=hardware, workload=workload)
    except PlanError as exc:
        print(f"parallel.plan: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    report = None
    if args.dry_run:
        from parallel.plan.dry_run import dry_run

        report = dry_run(
            model_config=typed_model(plain(cfg.model)),
            candidate=layout.candidate if layout is not None else result.best.candidate,
            model=model,
            hardware=hardware,
            workload=workload,
        )
    if args.json:
        out = {**plan_json(result, top=top), "planning_time_s": elapsed}
        for key, e in (("first_choice", result.ranked[0]), ("layout", layout)):
            if e is not None:
                hours = gpu_hours_per_trillion_tokens(e, hardware=hardware, workload=workload)
                out.setdefault("gpu_hours_per_trillion_tokens", {})[key] = hours
        if layout is not None:
            out["layout"] = layout.to_dict()
        if report is not None:
            out["dry_run"] = report.to_dict()
        print(json.dumps(out, indent=1))
    else:
        print_table(result, top=top, elapsed_s=elapsed)
        print_cost_lines(result, layout=layout, reference=args.reference_gpu_hours)
        if report is not None:
            print_dry_run(report)
    return 1 if report is not None and any(r.error for r in report.ranks) else 0
