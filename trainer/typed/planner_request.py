"""What the planner reads of a composed config, typed: the trainer's side of the planner's door
(``parallel/plan/api.py`` ``PlannerRequest``), for parallel=auto, the checked run's warnings and dry run, and the
sweep report's prediction. The typed run the workers read is ``trainer/typed/run_spec.py``'s. No torch import.
"""

from __future__ import annotations

from omegaconf import DictConfig

from models.objectives import holds_reference
from models.registry import planner_model
from models.spec import make_config
from parallel.config import PlannerConfig, TopologyConfig
from parallel.plan.api import PlannerRequest
from trainer.typed.sections import plain_values


def planner_request(cfg: DictConfig) -> PlannerRequest:
    """What the planner reads of this config (``parallel/plan/api.py``), typed: the model (its typed config and shape,
    one registry lookup), topology and planner sections, the batch, the sequence, the precision, the optimizer and
    the reference the ranks hold. The typed run shares its model config (``run_spec(..., model=)``)."""
    model, shape, problem = planner_model(plain_values(cfg.model))
    return PlannerRequest(
        model_config=model,
        model_shape=shape,
        shape_problem=problem,
        topology=make_config(TopologyConfig, plain_values(cfg.topology)),
        planner=make_config(PlannerConfig, plain_values(cfg.planner)),
        global_batch_size=int(cfg.data.global_batch_size or 0),
        seq_len=int(cfg.data.seq_len or 0),
        trainer_precision=str(cfg.trainer.precision),
        optim=plain_values(cfg.optim) if cfg.get("optim") is not None else None,
        reference_copy=holds_reference(str(cfg.trainer.objective), str(cfg.trainer.preference.reference)),
    )
