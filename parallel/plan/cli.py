"""``python -m parallel.plan [OVERRIDES] [--top N] [--json] [--dry-run]``: rank layouts for a model on a topology.

Composes conf/ with Hydra-style overrides exactly as train.py does (``model=gpt_175b
topology=cluster_1024xh100 planner.recompute=any``), starts no worker, needs no GPU and imports no torch
(unless ``topology.calibrate=true`` asks to measure this machine, or ``--dry-run`` builds the first choice
for sampled ranks under torch's fake process group: ``parallel/plan/dry_run.py``).

The one module of ``parallel/`` and ``models/`` that reads a composed config (tests/unit/test_config_stops.py): it
types the sections the planner reads (``specs_from_cfg``) and hands those objects on.
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
from models.registry import UnknownModel, hf_model, model_shape, spec_for
from models.shape import count_text
from models.spec import hydra_schema, make_config
from parallel.config import PlannerConfig, TopologyConfig
from parallel.foundation import dims
from parallel.plan.cost_model import Candidate, Estimate, estimate
from parallel.plan.search import TRAINER_AC, Plan, describe, pitfalls, plan, strategy_of
from parallel.plan.specs import GB, TRAINER_PRECISION, HardwareSpec, ModelShape, PlanError, Workload

CONF = Path(__file__).resolve().parents[2] / "conf"


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
    as training takes it (``models.registry.hf_model``; trainer/hf/start.py), the command line's ``model.*`` over it.
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
        spec, values, _ = hf_model(hf, start=str(start))
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


# ---- the one place the planner reads a composed config: it hands typed objects on ------------------


def typed_section(cls: type, node: Any) -> Any:
    """A composed config section as its schema's dataclass (``TopologyConfig``, ``PlannerConfig``)."""
    return make_config(cls, OmegaConf.to_container(node, resolve=True, enum_to_str=True))


def typed_model(node: Any) -> Any:
    """The model's own config, typed by its family (``ModelSpec.typed``)."""
    values = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    return spec_for(values).typed(values)


def specs_from_cfg(cfg: Any, *, calibrate: bool | None = None) -> tuple[ModelShape, HardwareSpec, Workload]:
    """Model, hardware (measured when ``topology.calibrate``) and workload of a composed config: its sections
    typed here once (``parallel=auto``, the trainer's warnings and dry run call this too)."""
    model_config = typed_model(cfg.model)
    model = model_shape(model_config)
    topology = typed_section(TopologyConfig, cfg.topology)
    planner = typed_section(PlannerConfig, cfg.planner)
    hardware = HardwareSpec.from_topology(topology)
    data = cfg.get("data") or {}
    trainer = cfg.get("trainer")

    def workload(hw: HardwareSpec, planner: PlannerConfig) -> Workload:
        return Workload.of(
            planner,
            model=model_config,
            global_batch_size=int(data.get("global_batch_size") or 0),
            seq_len=int(data.get("seq_len") or 0),
            trainer_precision=str(trainer.precision) if trainer is not None else None,
            hardware=hw,
            optim=cfg.get("optim"),
        )

    if calibrate if calibrate is not None else bool(topology.calibrate):
        from parallel.plan.calibrate import calibrate_hardware

        hardware = calibrate_hardware(
            hardware, model_config=model_config, workload=workload(hardware, planner), threads=topology.threads_per_rank
        )
    return model, hardware, workload(hardware, planner)


def plan_json(p: Plan, *, top: int) -> dict:
    m, h, w = p.model, p.hardware, p.workload
    return {
        "model": {
            "name": m.name,
            "params": m.params,
            "trainable_params": m.trainable_params,
            "n_layers": m.n_layers,
            "d_model": m.d_model,
            "n_heads": m.n_heads,
            "vocab_size": m.vocab_size,
            "seq_len": w.seq_len,
            "global_batch_size": w.global_batch_size,
            "precision": w.precision,
            "flops_per_token": m.training_flops_per_token(w.seq_len),
        },
        "topology": {
            "name": h.name,
            "nnodes": h.nnodes,
            "devices_per_node": h.devices_per_node,
            "world_size": h.world_size,
            "device_memory_bytes": h.memory_bytes,
            "memory_budget_bytes": h.memory_bytes * w.memory_fraction,
            "device_flops": h.flops,
            "intra_node_gbps": h.intra.gbps,
            "inter_node_gbps": h.inter.gbps,
            "intra_node_latency_s": h.intra.latency_s,
            "inter_node_latency_s": h.inter.latency_s,
            "microbatch_overhead_s": h.microbatch_overhead_s,
            "measured": h.measured,
        },
        "reason": p.reason if p.ranked else None,
        "pitfalls": plan_pitfalls(p),
        "rejected_over_memory": p.rejected,
        "candidates": [
            {"rank": i + 1, "strategy": strategy_of(e.candidate), **e.to_dict()} for i, e in enumerate(p.ranked[:top])
        ],
    }


def table_dims(model: ModelShape) -> tuple[str, ...]:
    """The degree columns of the table: the multiplying dimensions, and ep for a mixture of experts."""
    return (*dims.multiplying(), *(("ep",) if model.n_experts else ()))


def _row(i: int, e: Estimate, *, columns: tuple[str, ...]) -> list[str]:
    c, mem = e.candidate, e.memory
    return [
        str(i),
        strategy_of(c),
        *(str(c.size(n)) for n in columns),
        str(c.micro_batches),
        describe(c).split(f"m={c.micro_batches}", 1)[1].replace(f"recompute={c.recompute}", "").strip() or "-",
        TRAINER_AC[c.recompute],
        f"{mem.total / GB:.3g}",
        f"{(mem.params + mem.grads + mem.optimizer) / GB:.3g}",
        f"{mem.activations / GB:.3g}",
        f"{e.step_time_s:.4g}",
        f"{e.bubble_fraction:.1%}",
        f"{e.comm_fraction:.1%}",
    ]


def print_table(p: Plan, *, top: int, elapsed_s: float, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=160)
    m, h, w = p.model, p.hardware, p.workload
    console.print(
        f"[bold]{m.name}[/]: {count_text(m.params)} params"
        f"{f' ({count_text(m.trainable_params)} trainable: LoRA)' if m.lora_rank > 0 else ''}, "
        f"{m.training_flops_per_token(w.seq_len):.3g} FLOPs/token, "
        f"batch {w.global_batch_size} x {w.seq_len} tokens, {w.precision} (trainer.precision="
        f"{TRAINER_PRECISION[w.precision]}) | [bold]{h.name}[/]: {h.world_size} devices "
        f"({h.nnodes} x {h.devices_per_node}), {h.memory_bytes / GB:g} GB, {h.flops / 1e12:.3g} TFLOP/s, "
        f"links {h.intra.gbps:g}/{h.inter.gbps:g} Gbit/s intra/inter"
        + (f" [measured: {', '.join(f'{k}={v:.3g}' for k, v in h.measured.items())}]" if h.measured else "")
    )
    table = Table(
        title=f"top {min(top, len(p.ranked))} of {len(p.ranked)} layouts that fit ({p.rejected} over the memory budget; planned in {elapsed_s:.2f} s)"
    )
    for col in (
        "#",
        "strategy",
        *table_dims(m),
        "m",
        "schedule/sharding",
        "AC",
        "mem GB",
        "states GB",
        "act GB",
        "step s",
        "bubble",
        "comm",
    ):
        table.add_column(col, justify="right" if col not in ("strategy", "schedule/sharding") else "left")
    for i, e in enumerate(p.ranked[:top], start=1):
        table.add_row(*_row(i, e, columns=table_dims(m)))
    console.print(table)
    console.print(f"[bold]reason:[/] {p.reason}")
    for line in plan_pitfalls(p):
        console.print(f"[bold yellow]pitfall:[/] {line}")


def plan_pitfalls(p: Plan) -> list[str]:
    """The seed's traps for the first choice, with their numbers (``search.pitfalls``)."""
    if not p.ranked:
        return []
    best = p.ranked[0]
    return pitfalls(best.candidate, best, model=p.model, hardware=p.hardware, workload=p.workload)


def _versus(r, key: str) -> str:
    """``measured (estimated, +error)`` in GB."""
    ratio = r.ratio(key)
    got = f"{r.measured[key] / GB:.4g}"
    return f"{got} ({r.estimated[key] / GB:.4g}, {ratio - 1:+.1%})" if ratio else got


def _versus(r, key: str) -> str:
    """``measured (estimated, +error)`` in GB."""
    ratio = r.ratio(key)
    got = f"{r.measured[key] / GB:.4g}"
    return f"{got} ({r.estimated[key] / GB:.4g}, {ratio - 1:+.1%})" if ratio else got


def layout_candidate(text: str) -> Candidate:
    """``--layout "dp=128 pp=16 ep=64 zero=1 m=120 schedule=1f1b"`` as a ``Candidate`` (the degrees by their
    dimension names; ``m``: micro-batches; ``zero``: 0-3; ``schedule``, ``recompute``, ``v``: stages per rank;
    ``sp``: sequence parallel 0/1)."""
    fields = {"m": "micro_batches", "zero": "zero_stage", "schedule": "schedule", "recompute": "recompute",
              "v": "stages_per_rank", "sp": "sequence_parallel"}  # fmt: skip
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
        elif key in ("schedule", "recompute"):
            kwargs[fields[key]] = value
        else:
            kwargs[fields[key]] = bool(int(value)) if key == "sp" else int(value)
    if kwargs.get("schedule") is None:
        kwargs["schedule"] = "1f1b" if sizes.get("pp", 1) > 1 else "none"
    return Candidate(sizes=sizes, **kwargs)


def gpu_hours_per_trillion_tokens(e: Estimate, *, hardware: HardwareSpec, workload: Workload) -> float:
    """Device-hours one trillion training tokens take at the estimate's step time on every device of the topology."""
    tokens_per_step = workload.global_batch_size * workload.seq_len
    return e.step_time_s * hardware.world_size / 3600 * 1e12 / tokens_per_step


def print_cost_lines(p: Plan, *, layout: Estimate | None, reference: float | None, file=None) -> None:
    """GPU-hours per trillion tokens of the first choice and of ``layout`` (a published run's), beside ``reference``
    (the published figure) with their ratios."""
    rows = [("first choice", p.ranked[0])] if p.ranked else []
    rows += [("--layout", layout)] if layout is not None else []
    for name, e in rows:
        hours = gpu_hours_per_trillion_tokens(e, hardware=p.hardware, workload=p.workload)
        against = f"; published {reference:,.0f}, ratio {hours / reference:.2f}" if reference else ""
        fits = "" if e.fits else f" (does not fit: {e.memory.total / GB:.1f} GB > {e.budget_bytes / GB:.1f} GB)"
        print(
            f"{name}: {describe(e.candidate)}: {e.step_time_s:.4g} s/step, {hours:,.0f} GPU-hours per trillion tokens"
            f"{against}{fits}",
            file=file or sys.stdout,
        )


def print_dry_run(report, *, file=None) -> None:
    """Measured beside estimated bytes per sampled rank (``parallel/plan/dry_run.py``)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=160)
    lay = report.layout
    # dp, tp, pp always; cp and ep where used
    shown = [n for n in dims.names() if n in ("dp", "tp", "pp") or int(lay.get(n, 1)) > 1]
    table = Table(
        title=f"dry run: {' '.join(f'{n}{lay[n]}' for n in shown)} m={lay['micro_batches']} {lay['schedule']} "
        f"(v{lay['stages_per_rank']}, zero{lay['zero_stage']}, {lay['precision']}, recompute {lay['recompute']}) on "
        f"{report.world_size} ranks, "
        f"fake process group, {len(report.ranks)} sampled, {report.seconds:.1f} s"
    )
    coord_names = dims.coord_names() if int(lay.get("ep", 1)) > 1 else dims.mesh_names()
    mesh = "/".join(coord_names)
    for col in (
        "rank",
        mesh,
        "stages",
        "params GB",
        "grads GB",
        "optim GB",
        "states GB (est)",
        "act/mb GB (est)",
    ):
        table.add_column(col, justify="left" if col in (mesh, "stages") else "right")
    for r in report.ranks:
        coords = "/".join(str(r.coords[k]) for k in coord_names)
        if r.error:
            table.add_row(str(r.rank), coords, ",".join(map(str, r.stages)), f"[red]{r.error}[/]", "", "", "", "")
            continue
        m = r.measured
        table.add_row(
            str(r.rank),
            coords,
            ",".join(map(str, r.stages)),
            f"{m['params'] / GB:.4g}",
            f"{m['grads'] / GB:.4g}",
            f"{m['optimizer'] / GB:.4g}",
            _versus(r, "model_state"),
            _versus(r, "activations_per_micro_batch"),
        )
    console.print(table)


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
            model_config=typed_model(cfg.model),
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
