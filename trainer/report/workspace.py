"""A saved W&B workspace for a sweep's group, built with ``wandb-workspaces``:
``python -m trainer.report <sweep dir> --wandb-workspace``.

Panels: tokens/s against micro-batches (runs grouped by split points), the pipeline bubble and its parts
over the steps and against micro-batches, peak memory per pipeline rank, the loss curves, and a
parallel-coordinates view over the keys the sweep varied, ending in tokens/s and peak memory. The runset
is filtered to the sweep's W&B group. The spec is always written to ``<sweep dir>/wandb_workspace.json``
(what W&B would store); with an account configured (``WANDB_API_KEY`` or ``wandb login``) and
``--wandb-workspace-save`` (the default when an account is there) it is also saved to W&B and its URL
printed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trainer.observe.durable import write_text
from trainer.observe.metrics import read_metrics
from trainer.sweeps.jobs import SweepJob

log = logging.getLogger("meshtrain.report")

WORKSPACE_FILE = "wandb_workspace.json"


def swept_keys(jobs: list[SweepJob]) -> list[str]:
    """Override keys whose value differs between the sweep's jobs (``pp.micro_batches``, ...), in order."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for item in job.overrides:
            if "=" in item and not item.startswith(("hydra.", "hydra/")):
                key, value = item.split("=", 1)
                values.setdefault(key.lstrip("+~"), set()).add(value)
    return [k for k, v in values.items() if len(v) > 1]


def _history_keys(jobs: list[SweepJob]) -> set[str]:
    from trainer.observe.wandb_run import wandb_metrics

    keys: set[str] = set()
    for job in jobs:
        path = job.path / "metrics.jsonl"
        if path.exists():
            for record in read_metrics(path)[:3]:  # the history keys W&B gets (numbers only)
                keys.update(wandb_metrics(record))
    return keys


def _pp_ranks(jobs: list[SweepJob]) -> int:
    return max((int((j.summary or {}).get("layout", {}).get("pp") or 1) for j in jobs), default=1)


def build_workspace(*, jobs: list[SweepJob], group: str, entity: str | None, project: str) -> Any:
    """The ``wandb_workspaces.workspaces.Workspace`` of one sweep (nothing is sent)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    keys = _history_keys(jobs)
    step = "train/step"
    bubble_parts = sorted(k for k in keys if k.startswith("pipeline/bubble_"))
    swept = swept_keys(jobs)
    split_key = next((k for k in swept if k.endswith("split_points")), "pp.split_points")

    throughput = ws.Section(
        name="Throughput",
        is_open=True,
        panels=[
            wr.ScatterPlot(
                title="tokens/s vs micro-batches (runs grouped by split)",
                x=wr.Config("pp.micro_batches"),
                y=wr.SummaryMetric("tokens_per_s"),
            ),
            wr.LinePlot(title="tokens/s per step", x=step, y=["perf/tokens_per_s"]),
            wr.LinePlot(title="step time (s)", x=step, y=["perf/step_time_s"]),
        ],
    )
    bubble = ws.Section(
        name="Pipeline bubble",
        is_open=True,
        panels=[
            wr.LinePlot(title="bubble and its parts per step", x=step, y=bubble_parts or ["pipeline/bubble_fraction"]),
            wr.ScatterPlot(
                title="measured bubble vs micro-batches",
                x=wr.Config("pp.micro_batches"),
                y=wr.SummaryMetric("bubble_fraction"),
            ),
            wr.ScatterPlot(
                title="theoretical bubble vs micro-batches",
                x=wr.Config("pp.micro_batches"),
                y=wr.SummaryMetric("bubble_theoretical"),
            ),
        ],
    )
    memory = ws.Section(
        name="Memory",
        is_open=True,
        panels=[
            wr.BarPlot(
                title="peak memory per pipeline rank (bytes)",
                metrics=[wr.SummaryMetric(f"memory/peak_bytes_pp{p}") for p in range(_pp_ranks(jobs))],
                orientation="v",
            ),
        ],
    )
    loss = ws.Section(
        name="Loss",
        is_open=True,
        panels=[wr.LinePlot(title="training loss", x=step, y=["train/loss"])],
    )
    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in swept]
    columns += [
        wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("tokens_per_s")),
        wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("peak_memory_bytes_max")),
    ]
    sweep = ws.Section(
        name="Swept keys",
        is_open=True,
        panels=[wr.ParallelCoordinatesPlot(title="swept keys -> tokens/s, peak memory", columns=columns)],
    )
    return ws.Workspace(
        entity=entity or "",
        project=project,
        name=f"{group} (meshtrain sweep)",
        sections=[throughput, bubble, memory, loss, sweep],
        runset_settings=ws.RunsetSettings(
            filters=[expr.Metric("Group") == group],
            groupby=[expr.Config(split_key)],
        ),
    )


def workspace_spec(workspace: Any) -> dict[str, Any]:
    """What W&B stores for the workspace (its view), as JSON."""
    return json.loads(json.dumps(workspace._to_model().model_dump(by_alias=True, exclude_none=True), default=str))


def account_configured() -> bool:
    try:
        from wandb.apis import InternalApi

        return bool(InternalApi().api_key)
    except Exception:  # noqa: BLE001 - no settings, no key
        return False


def write_workspace(
    *, sweep_dir: Path, jobs: list[SweepJob], group: str, entity: str | None, project: str, save: bool | None = None
) -> dict[str, Any]:
    """Build the workspace, write its JSON spec, save it to W&B when an account is configured."""
    workspace = build_workspace(jobs=jobs, group=group, entity=entity, project=project)
    path = Path(sweep_dir) / WORKSPACE_FILE
    write_text(path, json.dumps(workspace_spec(workspace), indent=1) + "\n")
    out: dict[str, Any] = {"path": path, "url": None}
    if save is None:
        save = account_configured()
    if save:
        try:
            if not entity:
                import wandb

                workspace.entity = wandb.Api().default_entity
            workspace.save()
            out["url"] = workspace.url
        except Exception as exc:  # noqa: BLE001 - the JSON spec is still there
            log.warning("W&B workspace not saved (%s: %s); its spec is in %s", type(exc).__name__, exc, path)
    return out
