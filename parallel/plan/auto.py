"""``parallel=auto``: plan before validation, print the ranking and the reason, train the first choice.

Only layouts this checkout can train are considered (a ``conf/parallel/NAME.yaml`` whose strategy module
exists, FSDP as the only sharding). The config is rewritten in place, so validation, the layout, the workers
and summary.json all see the chosen layout as if the user had typed it, together with the precision and
activation recomputation the plan assumed (``trainer.precision``, ``trainer.activation_checkpointing``).
"""

from __future__ import annotations

import io
import logging
import sys
import time

from omegaconf import DictConfig

from parallel.plan.cli import CONF, print_table
from parallel.plan.search import apply_candidate, available_strategies, describe, plan, specs_from_cfg
from parallel.plan.specs import PlanError

log = logging.getLogger("meshtrain")


def resolve_auto(cfg: DictConfig) -> None:
    t0 = time.perf_counter()
    strategies = available_strategies(CONF)
    try:
        model, hardware, workload = specs_from_cfg(cfg)
        if hardware.world_size < 1:
            raise PlanError("topology describes no device")
        result = plan(model=model, hardware=hardware, workload=workload, allowed=strategies)
        best = result.best
    except PlanError as exc:
        raise PlanError(f"parallel=auto: {exc}") from None
    buf = io.StringIO()
    print_table(result, top=int(cfg.planner.top), elapsed_s=time.perf_counter() - t0, file=buf)
    print(buf.getvalue(), end="", file=sys.stdout, flush=True)
    apply_candidate(cfg, best.candidate, strategies=strategies, precision=workload.precision)
    log.info(
        "parallel=auto chose %s (predicted %.4g s/step) among strategies %s; trainer.precision=%s "
        "trainer.activation_checkpointing=%s",
        describe(best.candidate),
        best.step_time_s,
        ", ".join(sorted(strategies)),
        cfg.trainer.precision,
        cfg.trainer.activation_checkpointing,
    )
    cfg.topology.nproc_per_node = None if cfg.topology.nnodes == 1 else cfg.topology.nproc_per_node
