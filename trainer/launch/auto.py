"""``parallel=auto``: plan before validation, print the ranking and the reason, train the first choice.

Only layouts this checkout can train are considered (a ``conf/parallel/NAME.yaml`` whose strategy module
exists, FSDP as the only sharding). The config is rewritten in place (``apply_candidate``), so validation, the
layout, the workers and summary.json all see the chosen layout as if the user had typed it, together with the
precision and activation recomputation the plan assumed (``trainer.precision``, ``trainer.activation_checkpointing``).
The planner itself reads only typed objects (``parallel/plan/api.py``); ``trainer/typed/run_spec.py``'s
``trainer/typed/planner_request.py`` makes them.
"""

from __future__ import annotations

import io
import logging
import sys
import time

from omegaconf import DictConfig, OmegaConf

from parallel.assembly.registry import STRATEGIES
from parallel.foundation import dims
from parallel.foundation.precision import PLANNER_PRECISIONS
from parallel.plan.api import choose_layout
from parallel.plan.cost_model import Candidate
from parallel.plan.search import TRAINER_AC, describe, strategy_of
from parallel.plan.specs import PlanError
from parallel.plan.tables import print_table
from trainer.typed.planner_request import planner_request

log = logging.getLogger("meshtrain")


def apply_candidate(cfg: DictConfig, c: Candidate, *, strategies: dict[str, str], precision: str | None = None) -> None:
    """Rewrite ``cfg`` in place so that it asks for ``c`` (what ``parallel=auto`` trains): the layout, and
    the precision (the workload's planner precision, ``precision``) and activation checkpointing the plan assumed."""
    name = strategy_of(c)
    spec = STRATEGIES[name]
    if "trainer" in cfg:
        trains_as = PLANNER_PRECISIONS[precision].trains_as if precision is not None else None
        # fp8 is bf16-mixed with float8 matmuls: a plan in mixed precision keeps it
        if trains_as is not None and not (trains_as == "bf16-mixed" and cfg.trainer.precision == "fp8"):
            cfg.trainer.precision = trains_as
        cfg.trainer.activation_checkpointing = TRAINER_AC[c.recompute]
        cfg.trainer.ac_every = 1
    cfg.parallel._target_ = strategies[name]
    cfg.parallel.name = name
    for dim, size in c.sizes.items():
        OmegaConf.update(cfg, dims.dim(dim).key, size)
    # a strategy that always shards (fsdp) needs no dp.shard; hybrid shards when the candidate does
    cfg.dp.shard = c.zero_stage == 3 and not spec.shards_dp
    cfg.tp.sequence_parallel = c.sequence_parallel
    per_replica = int(cfg.data.global_batch_size) // c.dp
    if c.pp > 1:
        cfg.pp.micro_batches, cfg.pp.schedule, cfg.pp.stages_per_rank = c.micro_batches, c.schedule, c.stages_per_rank
        cfg.data.micro_batch_size = None
    else:
        cfg.pp.micro_batches, cfg.pp.stages_per_rank = 1, 1
        cfg.data.micro_batch_size = per_replica // c.micro_batches if c.micro_batches > 1 else None


def resolve_auto(cfg: DictConfig) -> None:
    """Plan (the config's planner inputs, the strategies this checkout can train), print the ranking, then rewrite
    ``cfg`` to ask for the first choice. Raises ``PlanError`` when nothing fits."""
    t0 = time.perf_counter()
    request = planner_request(cfg)
    try:
        result, strategies = choose_layout(request)
    except PlanError as exc:
        raise PlanError(f"parallel=auto: {exc}") from None
    best, workload = result.best, result.workload
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
