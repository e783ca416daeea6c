"""The sweep report and the sweep configs without starting any worker: rows, best, Pareto, statuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import CONF
from trainer.launch.environment import detect_external_launch
from trainer.report.cli import main as report_main
from trainer.report.cli import write_report
from trainer.report.rows import ReportRow, mark_best_and_pareto, peak_memory_per_stage
from trainer.sweeps.jobs import read_sweep

MIB = 1024 * 1024


def _row(job: int, tps: float | None, mem_mib: int | None, status: str = "completed") -> ReportRow:
    return ReportRow(
        job=job,
        status=status,
        strategy="pp",
        dp=1,
        tp=1,
        pp=2,
        schedule="1f1b",
        micro_batches=4,
        split_points=[2],
        tokens_per_s=tps,
        peak_memory_per_stage=[mem_mib * MIB] if mem_mib else [],
    )


def test_best_and_pareto_front():
    rows = [
        _row(0, 100, 300),
        _row(1, 200, 400),
        _row(2, 150, 500),
        _row(3, 90, 250),
        _row(4, None, None, "skipped"),
        _row(5, 200, 450),
    ]
    mark_best_and_pareto(rows)
    assert [r.job for r in rows if r.best] == [1]
    # 2 is beaten by 1 (faster, less memory); 5 ties 1 on speed with more memory
    assert [r.job for r in rows if r.pareto] == [0, 1, 3]


def test_peak_memory_per_stage_takes_the_max_over_each_stages_ranks():
    summary = {
        "peak_memory_bytes_per_rank": [10, 30, 20, 5],
        "layout": {
            "rank_map": [{"rank": 0, "pp": 0}, {"rank": 1, "pp": 1}, {"rank": 2, "pp": 0}, {"rank": 3, "pp": 1}]
        },
    }
    assert peak_memory_per_stage(summary) == [20, 30]


def _job(root: Path, num: int, *, config: dict, summary: dict | None = None, status: dict | None = None) -> None:
    folder = root / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"pp.micro_batches={config['pp']['micro_batches']}"])
    )
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if status is not None:
        (folder / "status.json").write_text(json.dumps(status))


def test_report_of_a_sweep_with_completed_skipped_and_crashed_jobs(tmp_path):
    cfg = {
        "parallel": {"name": "pp"},
        "dp": {"size": 1},
        "tp": {"size": 1},
        "pp": {"size": 2, "micro_batches": 4, "schedule": "gpipe", "split_points": [2]},
        "logger": {"wandb": {"mode": "disabled"}},
    }
    summary = {
        "status": "completed",
        "tokens_per_s": 1234.4,
        "median_step_time_s": 0.05,
        "peak_memory_bytes_per_rank": [100 * MIB, 80 * MIB],
        "layout": {
            "strategy": "pp",
            "dp": 1,
            "tp": 1,
            "pp": 2,
            "rank_map": [{"rank": 0, "pp": 0}, {"rank": 1, "pp": 1}],
        },
        "pipeline": {
            "schedule": "gpipe",
            "micro_batches": 4,
            "split_points": [2],
            "bubble_fraction": 0.3,
            "bubble_theoretical": 0.2,
            "bubble_schedule": 0.2,
            "bubble_imbalance": 0.04,
            "bubble_overhead": 0.06,
        },
    }
    _job(tmp_path, 0, config=cfg, summary=summary)
    _job(
        tmp_path,
        1,
        config={**cfg, "pp": {**cfg["pp"], "micro_batches": 1, "schedule": "1f1b"}},
        status={"status": "skipped", "reason": "invalid configuration:\n  - 1f1b needs m >= 2", "overrides": ["x=1"]},
    )
    _job(tmp_path, 2, config=cfg)  # neither summary nor status: crashed outside the task
    assert [j.status for j in read_sweep(tmp_path)] == ["completed", "skipped", "failed"]
    assert report_main([str(tmp_path), "--wandb", "disabled"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "3 jobs: 1 completed, 1 skipped, 1 failed" in report
    assert (
        "| ★ ◆ 0 | dp1·tp1·pp2 | gpipe | 4 | 2 | 1,234 | 50.0 | 30% | 20% | 20% + 4% + 6% | 100 / 80 | - | - | completed |"
        in report
    )
    assert "| 1 | dp1·tp1·pp2 | 1f1b | 1 | 2 | - | - | - | - | - | - | - | - | skipped: 1f1b needs m >= 2 |" in report
    assert "job 2 **failed**" in report and "crashed outside the task" in report
    assert json.loads((tmp_path / "sweep_status.json").read_text())["counts"] == {
        "completed": 1,
        "skipped": 1,
        "failed": 1,
        "preempted": 0,
    }


def test_report_refuses_a_folder_without_jobs(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 2
    assert "no job folders" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no such folder"):
        write_report(tmp_path / "missing")


def test_submitit_local_tasks_are_an_external_launch():
    env = {
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_JOB_ID": "4242",
    }
    ext = detect_external_launch(env)
    assert (ext.kind, ext.rank, ext.local_rank, ext.world_size, ext.nnodes) == ("submitit_local", 1, 1, 2, 1)
    assert detect_external_launch({**env, "SUBMITIT_LOCAL_NTASKS": "1"}) is None  # one task: it starts the workers


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiments_compose_and_validate(compose_cfg, name):
    from trainer.validate import validate

    cfg = compose_cfg(f"experiment={name}")
    assert validate(cfg).layout.world_size >= 1


def test_hparams_search_and_slurm_launcher_compose(compose_cfg):
    cfg = compose_cfg("hparams_search=pp_throughput", "hydra/launcher=slurm", return_hydra_config=True)
    assert cfg.parallel.name == "pp" and cfg.trainer.objective == "tokens_per_s"
    sweeper = cfg.hydra.sweeper
    assert sweeper.direction == "maximize" and sweeper.max_failure_rate == 1.0
    assert set(sweeper.params) == {"pp.schedule", "pp.micro_batches", "pp.split_points"}
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert {"nodes", "tasks_per_node", "gpus_per_node", "partition"} <= set(launcher)


def test_planner_prediction_of_a_jobs_config(compose_cfg):
    """The report asks the planner about each job's own layout; models it cannot describe get none."""
    from omegaconf import OmegaConf

    from trainer.report.rows import planner_prediction

    piped = {m: compose_cfg("parallel=pp", f"pp.micro_batches={m}") for m in (2, 8)}
    cnn = compose_cfg("model=cnn_bn", "data=images")
    times = {m: planner_prediction(OmegaConf.to_container(c)) for m, c in piped.items()}
    assert all(t is not None and t > 0 for t in times.values())
    assert times[8] != times[2]  # the layout's micro-batching reaches the cost model
    assert planner_prediction(OmegaConf.to_container(cnn)) is None


@pytest.mark.parametrize(
    "counts, code",
    [
        ({"completed": 1, "skipped": 2, "failed": 0}, 0),
        ({"completed": 0, "skipped": 3, "failed": 0}, 2),
        ({"completed": 0, "skipped": 2, "failed": 1}, 1),
        ({"completed": 0, "skipped": 0, "failed": 0, "preempted": 1}, 1),
        ({"completed": 0, "skipped": 0, "failed": 0}, 0),
    ],
)
def test_a_sweep_without_a_completed_job_exits_like_its_runs(counts, code):
    from trainer.sweeps.callback import no_completed_job_exit

    assert no_completed_job_exit(counts) == code


def test_the_sweep_folder_is_resolved_once_for_every_job():
    """Jobs compose again from hydra.overrides.hydra (in another process under submitit): the sweep folder's
    stamp, resolved at the sweep's start, is pinned there, so no job resolves it a second later."""
    from omegaconf import OmegaConf

    from trainer.sweeps.callback import ENDING_OPTUNA_SWEEPER, PLUGIN_OPTUNA_SWEEPER, SweepStatus

    calls = iter(["16-00-00", "16-00-01"])
    OmegaConf.register_new_resolver("test_tick", lambda: next(calls), replace=True)
    cfg = OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": "multirun/${test_tick:}"},
                "overrides": {"hydra": ["hydra.sweep.dir=old", "hydra/launcher=submitit_local"]},
                "sweeper": {"_target_": PLUGIN_OPTUNA_SWEEPER},
            }
        }
    )
    SweepStatus().on_multirun_start(cfg)
    assert list(cfg.hydra.overrides.hydra) == ["hydra/launcher=submitit_local", "hydra.sweep.dir=multirun/16-00-00"]
    assert cfg.hydra.sweeper._target_ == ENDING_OPTUNA_SWEEPER
