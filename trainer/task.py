"""The Hydra task: validate → prepare data → launch → return the objective for sweepers.

Errors end a single run with a clear message and a non-zero exit code (2: bad config or a run folder
another job holds, 1: a worker failed), never a traceback from deep inside torch. In a multirun the
failing job is recorded in its folder (``status.json``) and the sweep goes on.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from models.objectives import OBJECTIVES as PREFERENCE_OBJECTIVES
from parallel.foundation.run import RunSpec
from parallel.plan.api import PlannerRequest
from trainer.observe.durable import write_json
from trainer.observe.startup import STARTED_KEY, StartClock
from trainer.sweeps.jobs import sweep_name
from trainer.typed.planner_request import planner_request
from trainer.typed.run_spec import run_spec
from trainer.validate import ConfigError, ValidatedRun, validate

log = logging.getLogger("meshtrain")

EXIT_CONFIG = 2
EXIT_WORKER = 1
EXIT_RENDEZVOUS = 3


def hydra_run_meta() -> tuple[Path, dict[str, Any]]:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    from trainer.observe.wandb_run import provenance

    meta: dict[str, Any] = {"multirun": multirun, "overrides": list(hc.overrides.task)}
    meta[STARTED_KEY] = StartClock.for_job(multirun=multirun).started_unix
    meta["provenance"] = provenance(overrides=meta["overrides"])
    # hydra.verbose and hydra/job_logging, for the workers (trainer/observe/rank_logs.py)
    verbose = hc.verbose
    meta["logging"] = {
        "verbose": OmegaConf.to_container(verbose) if OmegaConf.is_config(verbose) else verbose,
        "job_logging": OmegaConf.to_container(hc.job_logging, resolve=True) if hc.job_logging else None,
    }
    if multirun:
        sweep = Path(hc.sweep.dir)
        meta["sweep_dir"] = str(sweep)
        meta["sweep_name"] = sweep_name(sweep)
        meta["job_num"] = int(hc.job.num)
        meta["run_name"] = f"{meta['sweep_name']}-job{hc.job.num}"
    else:
        meta["run_name"] = "run-" + "-".join(run_dir.parts[-2:])
    return run_dir, meta


def run_task(cfg: DictConfig) -> float | None:
    run_dir, meta = hydra_run_meta()
    cwd = HydraConfig.get().runtime.cwd
    if Path(cwd).resolve() != Path.cwd().resolve():  # hydra.job.chdir=true: the job left the user's folder
        user_paths(cfg, cwd=cwd)
    from trainer.launch.ownership import FolderBusy, discard, hold, owns_folders, release

    # the job's folder, held until it ends (a single run's callback took it already; hold is re-entrant)
    owner = owns_folders(node_rank=int(OmegaConf.select(cfg, "topology.node_rank", default=0) or 0))
    if owner:
        try:
            hold(run_dir, fix="hydra.sweep.dir" if meta["multirun"] else "hydra.run.dir")
        except FolderBusy as exc:
            print(f"meshtrain: {exc}", file=sys.stderr, flush=True)
            if meta["multirun"]:  # another job's folder: nothing written into it, the sweep goes on
                return None
            raise SystemExit(EXIT_CONFIG) from None
    try:
        return _run_owned(cfg, run_dir=run_dir, meta=meta)
    except SystemExit as exc:
        if owner and exc.code == EXIT_CONFIG and not meta["multirun"]:
            discard(run_dir)  # refused before it wrote anything: no folder left to sort as the newest run
        raise
    finally:
        if owner:
            release(run_dir)


def _run_owned(cfg: DictConfig, *, run_dir: Path, meta: dict[str, Any]) -> float | None:
    try:
        summary = train(cfg, run_dir=run_dir, run_meta=meta)
    except ConfigError as exc:
        return _fail(run_dir, meta, "skipped", str(exc), EXIT_CONFIG)
    except Exception as exc:  # noqa: BLE001 - reported with the failing rank's message
        from trainer.checkpoint.files import CheckpointError
        from trainer.data.datasets import DataError
        from trainer.launch.launcher import Preempted, RendezvousFailure, WorkerFailure
        from trainer.launch.preemption import EXIT_PREEMPTED

        if isinstance(exc, Preempted):
            return _fail(run_dir, meta, "preempted", str(exc), EXIT_PREEMPTED)
        if isinstance(exc, RendezvousFailure):
            return _fail(run_dir, meta, "failed", str(exc), EXIT_RENDEZVOUS)
        if isinstance(exc, WorkerFailure):
            return _fail(run_dir, meta, "failed", str(exc), EXIT_WORKER)
        if isinstance(exc, (DataError, CheckpointError)):
            return _fail(run_dir, meta, "failed", str(exc), EXIT_CONFIG)
        if meta["multirun"]:  # an unexpected error ends this job only: the sweep goes on and counts it
            log.exception("job %s failed", meta.get("job_num"))
            return _fail(run_dir, meta, "failed", f"{type(exc).__name__}: {exc}", EXIT_WORKER)
        raise
    if summary is None:  # not rank 0: nothing to report
        return None
    value = summary.get(sweep_key(cfg, summary))
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def sweep_key(cfg: DictConfig, summary: dict) -> str:
    """The summary key sweepers get: ``trainer.objective``, or for a training objective (dpo, simpo) its final
    validation loss when the run evaluated, else its final loss."""
    objective = str(cfg.trainer.objective)
    if objective not in PREFERENCE_OBJECTIVES:
        return objective
    return "val_loss" if "val_loss" in summary else "final_loss"


def _fail(run_dir: Path, meta: dict, status: str, reason: str, code: int) -> float | None:
    print(f"meshtrain: {reason}", file=sys.stderr, flush=True)
    if meta["multirun"]:
        write_json(run_dir / "status.json", {"status": status, "reason": reason, "overrides": meta["overrides"]})
        return None
    raise SystemExit(code)


def resolved_container(cfg: DictConfig) -> dict:
    """Plain, fully resolved containers travel to spawned workers (DictConfig does not pickle well); enum choices
    become their strings."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)  # type: ignore[return-value]


def check_resume(cfg: DictConfig, run_dir: Path, *, model_cfg: dict | None = None) -> None:
    """A checkpoint named by trainer.resume must be complete, whole and for this model (``model_cfg``: the resolved
    ``model`` section, resolved here when not given): checked here, before any worker starts (auto only considers
    complete checkpoints, so it cannot fail)."""
    from trainer.checkpoint.files import resumable

    model = model_cfg if model_cfg is not None else resolved_container(cfg.model)
    path = resumable(str(cfg.trainer.resume), run_dir, model)
    if path is None:  # never, or auto with nothing saved yet
        return
    from trainer.checkpoint.checkpointer import read_dcp_metadata

    read_dcp_metadata(path)


@dataclass(frozen=True)
class CheckedRun:
    """What the checks before any worker hand on, each made once: the validated layout (with an outer launcher's
    ranks), the typed run (``trainer/typed/run_spec.py``) and what the planner reads of it."""

    validated: ValidatedRun
    run: RunSpec
    request: PlannerRequest


def dry_run_layout(checked_run: CheckedRun, *, run_dir: Path) -> dict:
    """``trainer.dry_run=true``: the layout built for its ranks under a fake process group, measured beside
    the planner's estimate (``parallel/plan/dry_run.py``); written to dry_run.json, nothing trained."""
    from parallel.plan.api import dry_run_for
    from parallel.plan.specs import PlanError
    from parallel.plan.tables import print_dry_run

    world_size = checked_run.run.layout.world_size
    ranks = None if world_size > 16 else list(range(world_size))  # every rank, or a sample
    try:
        report, warnings = dry_run_for(checked_run.run, checked_run.request, ranks=ranks)
    except PlanError as exc:  # a model the planner cannot describe
        raise ConfigError([f"trainer.dry_run=true: {exc}"]) from None
    log_planner_warnings(warnings)
    print_dry_run(report)
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = {"status": "dry_run", "dry_run": report.to_dict()}
    write_json(run_dir / "dry_run.json", summary["dry_run"])
    from trainer.observe.files_sink import output_listing

    print(f"dry run written to {run_dir / 'dry_run.json'}; {output_listing(run_dir)}", flush=True)
    failed = [r.error for r in report.ranks if r.error]
    if failed:
        raise ConfigError(failed)
    return summary


def log_planner_warnings(warnings: list[str]) -> None:
    """The seed's pitfalls for the layout this run uses (``parallel/plan/api.py`` ``layout_warnings``; none for
    models the planner cannot describe)."""
    for warning in warnings:
        log.warning("warning (planner): %s", warning)


def checked(cfg: DictConfig) -> CheckedRun:
    """parallel=auto resolved, then validation and the typed run; validation's warnings logged (the planner's:
    ``preflight``, or the dry run's door call). Raises ConfigError."""
    if cfg.parallel.name == "auto":
        from parallel.plan.specs import PlanError
        from trainer.launch.auto import resolve_auto

        try:
            resolve_auto(cfg)  # parallel=auto: the planner's first choice replaces the layout, in place
        except PlanError as exc:
            raise ConfigError([str(exc)]) from None
    validated = validate(cfg)
    for warning in validated.warnings:
        log.warning("warning: %s", warning)
    request = planner_request(cfg)  # the model typed once: the typed run reads the request's
    run = run_spec(cfg, validated.layout, model=request.model_config)
    return CheckedRun(validated=validated, run=run, request=request)


def preflight(cfg: DictConfig, *, run_dir: Path, clock: StartClock) -> tuple[CheckedRun, dict]:
    """Everything that can refuse a run before a worker starts: parallel=auto, validation (the planner's warnings for
    the layout logged), the resume checkpoint, the data (prepared once here) and its vocabulary. Raises ConfigError,
    DataError or CheckpointError (exit code 2); returns the checked run and the resolved config for the workers."""
    from parallel.plan.api import layout_warnings

    checked_run = checked(cfg)
    log_planner_warnings(layout_warnings(checked_run.run, checked_run.request))
    cfg_dict = resolved_container(cfg)

    from hydra.utils import instantiate

    check_resume(cfg, run_dir, model_cfg=cfg_dict["model"])
    data = instantiate(cfg.data, seed=int(cfg.trainer.seed))
    clock.say(f"preparing the data ({describe_data(cfg)})")
    data.prepare()
    if "vocab_size" in cfg.model:
        data.check_vocab(int(cfg.model.vocab_size))
    note = data.check_validation(eval_every=int(cfg.trainer.eval_every), eval_batches=int(cfg.trainer.eval_batches))
    if note:
        log.warning("warning: %s", note)
    return checked_run, cfg_dict


def describe_data(cfg: DictConfig) -> str:
    """The data a run reads, as the start-up line names it: its kind and, where it has one, its path."""
    path = cfg.data.get("path")
    return f"data={cfg.data.get('name')}" + (f" from {path}" if path else "")


def start_from_folder(cfg: DictConfig, *, run_dir: Path) -> None:
    """``model.init_from=DIR`` without a ``model=`` of the run's own: the model config.json describes replaces the
    default one (trainer/hf/start.py), logged and saved in the run's .hydra/config.yaml. Raises ConfigError."""
    if not cfg.model.get("init_from"):
        return
    from trainer.hf.start import InitFromError, adopt, chose_model

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    if chose_model(overrides, hc.runtime.choices.get("model")):
        return
    try:
        notes = adopt(cfg, overrides=overrides)
    except InitFromError as exc:
        raise ConfigError([str(exc)]) from None
    log.info(notes[0])
    for note in notes[1:]:
        log.warning("warning: %s", note)
    saved = run_dir / hc.output_subdir / "config.yaml" if hc.output_subdir else None
    if saved is not None and saved.is_file():
        OmegaConf.save(cfg, saved)


def user_paths(cfg: DictConfig, *, cwd: str | Path) -> None:
    """The user's paths (``conf.schema.USER_PATH_KEYS``) made absolute against ``cwd``, the folder the command ran
    in, in place: where the job runs elsewhere (``hydra.job.chdir=true``), ``data.path=data/x`` still names the
    user's ``data/x``, for the checks here and for the workers. Values Hydra interpolates are left to resolve."""
    from conf.schema import USER_PATH_KEYS

    for key, words in USER_PATH_KEYS.items():
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent)
        if not isinstance(node, DictConfig) or leaf not in node or OmegaConf.is_interpolation(node, leaf):
            continue
        value = node[leaf]
        if isinstance(value, str) and value and value not in words:
            node[leaf] = str(Path(cwd, Path(value).expanduser()))


def train(cfg: DictConfig, *, run_dir: Path, run_meta: dict[str, Any]) -> dict | None:
    """Validate, then run the job's workers; returns rank 0's summary (trainer.dry_run: the dry run's)."""
    clock = StartClock.from_meta(run_meta)
    clock.say(f"checking the run: parallel={cfg.parallel.name} model={cfg.model.get('name')} in {run_dir}")
    start_from_folder(cfg, run_dir=run_dir)
    if cfg.trainer.dry_run:
        checked_run = checked(cfg)
        clock.say(f"dry run: building the {checked_run.run.layout.world_size} ranks of the layout in this process")
        return dry_run_layout(checked_run, run_dir=run_dir)
    checked_run, cfg_dict = preflight(cfg, run_dir=run_dir, clock=clock)
    validated = checked_run.validated
    clock.say("importing torch and the launcher")
    from trainer.launch.launcher import launch

    run_dir.mkdir(parents=True, exist_ok=True)
    return launch(
        cfg, cfg_dict, layout=validated.layout, external=validated.external, run_dir=run_dir, run_meta=run_meta
    )
