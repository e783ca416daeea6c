"""Sweeps as a user runs them (real multiruns through train.py) and the sweep report."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.faults import FailAt, inject
from tests.helpers import FAST, run_train
from trainer.observe.wandb_read import read_run
from trainer.report.cli import write_report
from trainer.report.rows import planner_prediction
from trainer.sweeps.jobs import read_sweep, sweep_name

STEPS = ("trainer.max_steps=3",)
NO_LOGGER = tuple(o for o in FAST if not o.startswith("logger="))


def table_rows(report_md: str) -> list[list[str]]:
    lines = [line for line in report_md.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]  # without the header


def job_cells(rows: list[list[str]]) -> dict[int, list[str]]:
    return {int(row[0].split()[-1]): row for row in rows}


def _finished_run(run_dir, timeout: float = 30.0):
    """The report's W&B run, read once W&B's service (still alive in this process) has flushed it to disk."""
    deadline = time.monotonic() + timeout
    while True:
        run = read_run(run_dir)
        if (run.group and "best_tokens_per_s" in run.summary) or time.monotonic() > deadline:
            return run
        time.sleep(0.5)


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    """4 jobs: m in {2, 4} x split in {[1], [3]}, logged to W&B offline."""
    sweep_dir = tmp_path_factory.mktemp("grid") / "sweep"
    run = run_train(
        "parallel=pp",
        "pp.micro_batches=2,4",
        "pp.split_points=[1],[3]",
        *NO_LOGGER,
        *STEPS,
        "logger=wandb",
        run_dir=sweep_dir,
        multirun=True,
    )
    return run, sweep_dir


@pytest.mark.slow
def test_grid_sweep_report_has_one_row_per_job_with_the_summaries_values(grid_sweep):
    run, sweep_dir = grid_sweep
    assert "4 jobs: 4 completed, 0 skipped, 0 failed" in run.output
    assert json.loads((sweep_dir / "sweep_status.json").read_text())["counts"]["completed"] == 4
    if not (sweep_dir / "report.md").exists():  # before any report: the sweep's end linked every job's W&B run
        linked = [p for p in (sweep_dir / "wandb").iterdir() if p.is_symlink()]
        assert sorted(str(p.readlink()).split("/")[1] for p in linked) == ["0", "1", "2", "3"]
    summaries = {j.num: j.summary for j in read_sweep(sweep_dir)}
    configs = {j.num: j.config for j in read_sweep(sweep_dir)}
    assert sorted(summaries) == [0, 1, 2, 3] and all(s is not None for s in summaries.values())

    out = write_report(sweep_dir, wandb_mode="offline")
    cells = job_cells(table_rows(out["report"].read_text()))
    assert sorted(cells) == [0, 1, 2, 3]
    seen = set()
    for num, s in summaries.items():
        row = cells[num]
        pipe = s["pipeline"]
        assert (
            row[2] == "1f1b"
            and row[3] == str(pipe["micro_batches"])
            and row[4] == ",".join(map(str, pipe["split_points"]))
        )
        assert row[5] == f"{s['tokens_per_s']:,.0f}"
        assert row[6] == f"{s['median_step_time_s'] * 1000:.1f}"
        assert row[7] == f"{pipe['bubble_fraction']:.0%}" and row[8] == f"{pipe['bubble_theoretical']:.0%}"
        parts = [float(p.rstrip("%")) / 100 for p in row[9].split(" + ")]
        assert parts[0] == pytest.approx(pipe["bubble_schedule"], abs=0.005)
        assert sum(parts) == pytest.approx(pipe["bubble_fraction"], abs=0.03)
        predicted = planner_prediction(configs[num])
        assert predicted is not None and row[11] == f"{predicted * 1000:.1f}"
        assert row[12] == f"{(predicted - s['median_step_time_s']) / s['median_step_time_s']:+.0%}"
        assert row[-1] == "completed"
        seen.add((pipe["micro_batches"], tuple(pipe["split_points"])))
    assert seen == {(2, (1,)), (2, (3,)), (4, (1,)), (4, (3,))}
    best = max(summaries, key=lambda n: summaries[n]["tokens_per_s"])
    assert cells[best][0].startswith("★")
    for name in ("tokens_per_s_vs_m", "bubble_vs_m", "peak_memory_vs_split", "pareto"):
        assert out["plots"][name].stat().st_size > 5000


@pytest.mark.slow
def test_wandb_runs_of_a_sweep_share_one_group_with_the_report_run(grid_sweep):
    _, sweep_dir = grid_sweep
    runs = [read_run(sweep_dir / str(n)) for n in range(4)]
    assert {r.group for r in runs} == {sweep_name(sweep_dir)}
    assert {r.job_type for r in runs} == {"pp"}
    assert all({"pp", "pp2", "1f1b"} <= set(r.tags) for r in runs)
    assert len({r.run_id for r in runs}) == 4
    # the report test may not have run first (wandb/ holds links to the jobs' runs either way)
    if not (sweep_dir / "report.md").exists():
        write_report(sweep_dir, wandb_mode="offline")
    report_run = _finished_run(sweep_dir)
    assert report_run.group == runs[0].group and report_run.job_type == "sweep-report"
    assert report_run.summary["best_tokens_per_s"] == max(
        json.loads((sweep_dir / str(n) / "summary.json").read_text())["tokens_per_s"] for n in range(4)
    )


@pytest.mark.slow
def test_invalid_combinations_are_skipped_with_their_reason_and_the_others_run(tmp_path):
    sweep_dir = tmp_path / "sweep"
    run = run_train(
        "parallel=pp",
        "pp.schedule=1f1b",
        "pp.micro_batches=1,2",
        "pp.split_points=[2],[9]",
        *FAST,
        *STEPS,
        run_dir=sweep_dir,
        multirun=True,
    )
    assert "4 jobs: 1 completed, 3 skipped, 0 failed" in run.output
    jobs = {(j.config["pp"]["micro_batches"], tuple(j.config["pp"]["split_points"])): j for j in read_sweep(sweep_dir)}
    ok = jobs[(2, (2,))]
    assert ok.status == "completed" and (ok.path / "summary.json").exists()
    for key, needle in [
        ((1, (2,)), "1f1b needs at least as many micro-batches"),
        ((2, (9,)), "split"),
        ((1, (9,)), ""),
    ]:
        job = jobs[key]
        status = json.loads((job.path / "status.json").read_text())
        assert status["status"] == "skipped" and needle in status["reason"]
        assert not (job.path / "logs").exists(), "a skipped job must not start workers"
    report = write_report(sweep_dir, wandb_mode="disabled")["report"].read_text()
    cells = job_cells(table_rows(report))
    assert cells[ok.num][-1] == "completed" and cells[ok.num][0].startswith("★")
    skipped = cells[jobs[(1, (2,))].num]
    assert skipped[3] == "1" and skipped[5] == "-" and skipped[-1].startswith("skipped:")
    assert "1f1b needs at least as many micro-batches" in report


@pytest.mark.slow
def test_optuna_search_runs_three_trials_and_copes_with_a_skipped_one(tmp_path):
    """Seeded TPE picks gpipe, 1f1b, gpipe: the 1f1b trial (m=1 < 2 stages) is skipped and marked
    failed in the study; the best value is the best completed job's tokens/s."""
    sweep_dir = tmp_path / "optuna"
    run = run_train(
        "hparams_search=pp_throughput",
        "hydra.sweeper.n_trials=3",
        "pp.schedule=choice(1f1b,gpipe)",
        "pp.micro_batches=1",
        "pp.split_points=[2]",
        *FAST,
        *STEPS,
        run_dir=sweep_dir,
        multirun=True,
    )
    jobs = read_sweep(sweep_dir)
    assert [j.status for j in jobs] == ["completed", "skipped", "completed"], run.output[-3000:]
    assert "Failed experiment: Return value must be float-castable. Got 'None'" in run.output
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(max(j.summary["tokens_per_s"] for j in jobs if j.summary))
    assert result["best_params"] == {"pp.schedule": "gpipe"}


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_job_with_one_task_per_worker(tmp_path):
    """The Slurm path (srun-style: one task per worker, rank from the environment) on submitit's local executor."""
    sweep_dir = tmp_path / "submitit"
    run = run_train(
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        "hydra.launcher.timeout_min=5",
        "parallel=pp",
        "pp.micro_batches=2",
        *FAST,
        *STEPS,
        run_dir=sweep_dir,
        multirun=True,
    )
    assert "1 jobs: 1 completed" in run.output
    job = sweep_dir / "0"
    summary = json.loads((job / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["layout"]["world_size"] == 2
    assert (job / "logs" / "rank1.log").exists()
    assert not (job / "logs" / "elastic").exists(), "the tasks are the workers: no elastic agent"
    assert list((sweep_dir / ".submitit").iterdir())


@pytest.mark.slow
def test_submitit_local_runs_jobs_one_after_another_and_says_so(tmp_path):
    """Issue 42: the plugin's submitit_local started every job of a sweep at once and said nothing until all ended.
    meshtrain's runs as many at a time as the cores hold (the default job's 2 ranks fill 2 cores: one at a time) and
    says each job's start and end; the jobs' own logs show them one after another."""
    from tests.helpers import log_time
    from trainer.checks.topology import cpu_cores

    # on a machine with room for two such jobs, ask for one at a time, so that the same order is checked
    pace = [] if cpu_cores() // 2 <= 1 else ["+hydra.launcher.array_parallelism=1"]
    sweep_dir = tmp_path / "paced"
    run = run_train(
        "hydra/launcher=submitit_local", "trainer.seed=1,2,3", *pace, *FAST, *STEPS, run_dir=sweep_dir, multirun=True
    )
    assert "3 jobs: 3 completed" in run.output, run.output[-3000:]
    assert "submitit_local: 3 job(s)" in run.output and ", 1 at a time (" in run.output
    said = [line.split("] ", 1)[1] for line in run.proc.stdout.splitlines() if "] job #" in line]
    said = [line for line in said if " running for " not in line]  # a job past 30 s also says its last line
    order = [" ".join(line.split()[:3]) for line in said]
    assert order == [f"job #{j} {what}" for j in range(3) for what in ("started", "ended")], said
    assert all("completed, final loss" in line for line in said if " ended after " in line)
    spans = []
    for j in range(3):
        log = sweep_dir / str(j) / "logs" / "rank0.log"
        lines = log.read_text().splitlines()
        spans.append((log_time(log, lines[0][24:]), log_time(log, "outputs in")))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, spans  # a job's first log line after the previous job's last


VAL_SEARCH = ("hparams_search=val_loss", "hydra.sweeper.n_trials=2", "trainer.eval_batches=1", "parallel=single")


@pytest.mark.slow
def test_validation_loss_search_completes_its_trials_and_one_without_evaluation_ends_with_exit_2(tmp_path):
    """The README's `-m hparams_search=val_loss`: each trial returns summary.json's val_loss, the best is the
    lowest; with trainer.eval_every=0 every trial is skipped, and the sweep ends with meshtrain's summary and
    exit code 2, not Optuna's 'No trials are completed yet' traceback."""
    sweep_dir = tmp_path / "val"
    run = run_train(*VAL_SEARCH, "trainer.eval_every=2", *FAST, *STEPS, run_dir=sweep_dir, multirun=True)
    jobs = read_sweep(sweep_dir)
    assert [j.status for j in jobs] == ["completed", "completed"], run.output[-3000:]
    assert "2 jobs: 2 completed, 0 skipped, 0 failed" in run.output
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(min(j.summary["val_loss"] for j in jobs))

    skipped_dir = tmp_path / "skipped"
    run = run_train(
        *VAL_SEARCH, "trainer.eval_every=0", *FAST, *STEPS, run_dir=skipped_dir, multirun=True, expect_ok=False
    )
    assert run.proc.returncode == 2, run.output[-3000:]
    assert "2 jobs: 0 completed, 2 skipped, 0 failed" in run.output
    assert "job 1 skipped: invalid configuration" in run.output and "needs an evaluation" in run.output
    assert "Traceback" not in run.output and "No trials are completed yet" not in run.output
    assert not (skipped_dir / "optimization_results.yaml").exists()


@pytest.mark.slow
def test_a_job_after_a_failed_in_process_job_starts_and_ends(tmp_path):
    """A parallel=single job runs in the launcher's process; when it fails, its gloo process group is left in a
    reference cycle. The next job's forked workers collected it in their first gc pass and hung forever (its
    destructor joined gloo threads that only the launcher has); the launcher now collects before forking."""
    run = run_train(
        "parallel=single,ddp",
        inject(FailAt, step=2),
        *FAST,
        *STEPS,
        run_dir=tmp_path / "sweep",
        multirun=True,
        timeout=120,
        expect_ok=False,
    )
    assert "2 jobs: 0 completed, 0 skipped, 2 failed" in run.output, run.output[-3000:]
    assert run.output.count("injected failure at step 2") >= 2
