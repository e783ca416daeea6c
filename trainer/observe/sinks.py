"""Rank 0's sinks: the list ``logger=`` asks for, and how a run ends on them.

The console and the run folder's files (metrics.jsonl, summary.json) are always there; the trackers come from
``logger=``: ``wandb`` (``logger.wandb.mode`` other than disabled), ``tensorboard`` (``logger.tensorboard.enabled``),
both (``logger=wandb_tensorboard`` or ``logger=[wandb,tensorboard]``), or none (``logger=none``)."""

from __future__ import annotations

from typing import Any

from parallel.assembly.context import WorkerContext
from parallel.foundation.figures import draw_announced
from trainer.observe.console import ConsoleSink
from trainer.observe.files_sink import FilesSink
from trainer.observe.sink import Sink


def build_sinks(*, ctx: WorkerContext, cfg_dict: dict, run_meta: dict[str, Any], start_step: int = 0) -> list[Sink]:
    """Global rank 0's sinks, in the order they receive each record."""
    logger = ctx.cfg.logger
    sinks: list[Sink] = [
        ConsoleSink(total_steps=int(ctx.cfg.trainer.max_steps), start_step=start_step, log=ctx.log),
        FilesSink(run_dir=ctx.run_dir, cfg_dict=cfg_dict, start_step=start_step),
    ]
    if str(logger.wandb.mode) != "disabled":
        from trainer.observe.wandb_sink import WandbSink

        sinks.append(
            WandbSink(
                settings=logger.wandb,
                layout=ctx.layout,
                run_dir=ctx.run_dir,
                cfg_dict=cfg_dict,
                run_meta=run_meta,
                log=ctx.log,
            )
        )
    tb = logger.get("tensorboard") or {}
    if tb.get("enabled"):
        from trainer.observe.tensorboard_sink import TensorBoardSink

        sinks.append(TensorBoardSink(log_dir=ctx.run_dir / str(tb.get("dir") or "tensorboard")))
    return sinks


def finish_sinks(sinks: list[Sink], summary: dict[str, Any] | None, *, exit_code: int, log: Any) -> None:
    """The run's end on every sink: the figures announced during the run drawn (a failure loses only the picture),
    the summary (None: the run failed before it had one) completed by the sinks and handed to each, then every sink
    closed, whatever failed before."""
    try:
        try:
            draw_announced()
        except Exception as exc:  # noqa: BLE001 - the summary and the trackers must still be written
            log.warning("a figure of the run was not drawn: %s: %s", type(exc).__name__, exc)
        if summary is not None:
            for sink in sinks:
                summary.update(sink.summary_fields())
            for sink in sinks:
                sink.log_summary(summary)
    finally:
        failures = []
        for sink in sinks:
            try:
                sink.close(exit_code=exit_code)
            except Exception as exc:  # noqa: BLE001 - the other sinks still close; the first failure is raised
                failures.append(exc)
        if failures:
            raise failures[0]
