"""The planner's tables: a ranking (``print_table``, ``plan_json``), the GPU-hours of a plan and a given layout
(``print_cost_lines``) and a dry run (``print_dry_run``), as the command line (``python -m parallel.plan``),
``parallel=auto`` and ``trainer.dry_run=true`` print them."""

from __future__ import annotations

import sys

from parallel.foundation import dims
from parallel.plan.cost_model import Estimate, planned_dims
from parallel.plan.search import TRAINER_AC, Plan, describe, strategy_of
from parallel.plan.specs import GB, TRAINER_PRECISION, HardwareSpec, ModelShape, Workload, count_text


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
    """The degree columns of the table: those the planner varies for the model (``cost_model.planned_dims``)."""
    return planned_dims(model)


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
    """The seed's traps for the first choice, with their numbers (``Plan.pitfalls``)."""
    return list(p.pitfalls)


def _versus(r, key: str) -> str:
    """``measured (estimated, +error)`` in GB."""
    ratio = r.ratio(key)
    got = f"{r.measured[key] / GB:.4g}"
    return f"{got} ({r.estimated[key] / GB:.4g}, {ratio - 1:+.1%})" if ratio else got


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
    shown = [n for n in dims.names() if n in dims.ALWAYS_NAMED or int(lay.get(n, 1)) > 1]  # the others where used
    table = Table(
        title=f"dry run: {' '.join(f'{n}{lay[n]}' for n in shown)} m={lay['micro_batches']} {lay['schedule']} "
        f"(v{lay['stages_per_rank']}, zero{lay['zero_stage']}, {lay['precision']}, recompute {lay['recompute']}) on "
        f"{report.world_size} ranks, "
        f"fake process group, {len(report.ranks)} sampled, {report.seconds:.1f} s"
    )
    borrowed = any(int(lay.get(n, 1)) > 1 for n in dims.borrowing())
    coord_names = dims.coord_names() if borrowed else dims.mesh_names()
    mesh = "/".join(coord_names)
    held = any(r.estimated.get("reference") for r in report.ranks)  # a frozen reference model (DPO, copy)
    for col in (
        "rank",
        mesh,
        "stages",
        "params GB",
        "grads GB",
        "optim GB",
        "states GB (est)",
        "act/mb GB (est)",
        *(["reference GB (est)"] if held else []),
    ):
        table.add_column(col, justify="left" if col in (mesh, "stages") else "right")
    for r in report.ranks:
        coords = "/".join(str(r.coords[k]) for k in coord_names)
        if r.error:
            table.add_row(str(r.rank), coords, ",".join(map(str, r.stages)), f"[red]{r.error}[/]", *[""] * (4 + held))
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
            *([_versus(r, "reference")] if held else []),
        )
    console.print(table)
