"""A guarded W&B run: the real ``wandb`` library, offline unless told otherwise. A training run's rank 0 logs through
it (``wandb_sink.py``), and so does the sweep report (``trainer/report/cli.py``).

W&B's import and ``init`` took 1.5–2.3 s of rank 0's CPU in a training run; without the work that records nothing
here (``_without_idle_work``) 0.4–0.8 s, nearly all of it ``import wandb``, which a worker forked on CPU finds done
by the launcher (``trainer/launch/start_method.py``). They run in a background thread started by the first logged
step (after the first training step); steps logged before the run is ready are queued and sent in order. An online run that cannot reach its server within
``logger.wandb.init_timeout`` falls back to offline with a warning instead of retrying for minutes.
``finish`` is always called, with a non-zero exit code when the run failed.

With ``identity`` (a training run) the client opens the run folder's own W&B run id with
``resume="allow"`` (``trainer/observe/wandb_run.py``), names metrics by section (``train/loss``,
``perf/tokens_per_s``, ``pipeline/bubble_fraction`` ...), defines the step metric and summaries, and logs
checkpoints as artifacts by reference (``file://``, nothing uploaded) and the resolved config as an artifact.

W&B never stops training: every call into ``wandb`` is guarded; the first failure (its service gone,
a full disk, a bug) is logged once and the client turns itself off, while metrics.jsonl keeps every step. Nor does
it hold training: waiting for the start, a checkpoint's artifact, the summary, files and the run's end is given up
after ``logger.wandb.answer_timeout_s`` (the start: after ``init_timeout`` more), with the same warning. Seen in the
Slurm sweep test: a stop signal, which Slurm sends every process of a job step (W&B's service among them), landed
while rank 0's W&B was starting, and rank 0 never came back from W&B after saving its checkpoint, while rank 1
waited for it in the run's summary until the collective timed out (300 s).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainer.observe.wandb_run import RunIdentity, define_metrics, wandb_key, wandb_metrics


def _without_idle_work(wandb: Any, *, mode: str) -> None:
    """Leave out two things ``wandb.init`` does that record nothing for this run (their CPU is taken from the
    training ranks while they step: docs/benchmarks.md, the ddp pair).

    - W&B's own telemetry to W&B's servers (OpenTelemetry export threads, a timing per ``log`` call) is set up from
      the process-wide settings, online unless told, whatever the run's mode: an offline run declares the process
      offline, so nothing is set up to send (it had nowhere to send it). An online run keeps it
      (``WANDB_ERROR_REPORTING=false`` is W&B's own switch).
    - ``wandb.init`` applies W&B Launch inputs staged in this process by importing W&B Launch (its agent, public
      API and HTTP client) even when none were: inputs are staged only through the module that holds them, so
      while that module was never imported there is nothing to apply and the import is skipped.
    """
    if mode == "offline":
        wandb.setup(settings=wandb.Settings(mode="offline"))
    from wandb.sdk.wandb_run import Run

    apply = getattr(Run, "_detect_and_apply_job_inputs", None)
    if apply is None or getattr(apply, "meshtrain_skips_unstaged", False):  # another W&B version: left as it is
        return

    def apply_staged(run: Any) -> None:
        if "wandb.sdk.launch.inputs.internal" in sys.modules:
            apply(run)

    apply_staged.meshtrain_skips_unstaged = True  # type: ignore[attr-defined]
    Run._detect_and_apply_job_inputs = apply_staged


def _within(call, seconds: float) -> None:
    """``call()`` on a daemon thread, waited for at most ``seconds``: its exception raised here, or TimeoutError
    (the thread is left to W&B: a call into a service that stopped answering never returns)."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append(exc)

    thread = threading.Thread(target=run, name="wandb-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s (logger.wandb.answer_timeout_s)")
    if outcome:
        raise outcome[0]


class WandbClient:
    def __init__(
        self,
        *,
        mode: str,
        project: str,
        run_dir: Path,
        config: dict[str, Any],
        log: logging.Logger,
        entity: str | None = None,
        group: str | None = None,
        job_type: str | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
        init_timeout: float = 15.0,
        answer_timeout_s: float = 60.0,
        system_stats: bool = False,
        console: str = "off",
        save_requirements: bool = False,
        identity: RunIdentity | None = None,
        git: dict[str, Any] | None = None,
    ):
        self.run = None
        self.failed = False
        self.identity = identity
        self.init_timeout = init_timeout
        self.answer_timeout_s = answer_timeout_s
        self._given_up = False  # ready() stopped waiting for the start: a run that starts later is not used
        self._logged_step: int | None = None  # last step this process sent
        self.log = log
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pending: list[tuple[dict[str, Any], int]] = []  # steps logged before init finished
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        kwargs = dict(
            project=project,
            entity=entity,
            group=group,
            job_type=job_type,
            tags=list(tags or []),
            name=name,
            config=config,
            dir=str(run_dir),
        )
        if identity is not None:
            kwargs.update(id=identity.id, resume="allow")
        settings = dict(
            console=console,
            x_disable_stats=not system_stats,
            x_disable_machine_info=not system_stats,
            x_save_requirements=save_requirements,
        )
        # the commit is recorded even with machine info off (it also sits in the config under run.git)
        if git and git.get("commit"):
            settings.update(
                git_commit=git["commit"], **({"git_remote_url": git["remote"]} if git.get("remote") else {})
            )
        # started by the first logged step, i.e. after the first training step: W&B's import and service
        # start compete for the cores, and the time to the first step should not pay for them
        self._thread = threading.Thread(
            target=self._init, args=(mode, kwargs, settings, init_timeout), name="wandb-init", daemon=True
        )

    def _init(self, mode: str, kwargs: dict, settings: dict, init_timeout: float) -> None:
        # Our own W&B service, not one inherited through WANDB_SERVICE from a process that started us (a sweep's
        # report run in the same Python, a notebook): an inherited service outlives a killed rank 0 and kept its
        # run id "in use" for over 15 s while the elastic restart's rank 0 waited for it (seen in the suite).
        os.environ.pop("WANDB_SERVICE", None)
        try:
            import wandb

            _without_idle_work(wandb, mode=mode)
            try:
                run = self._init_while_id_in_use(
                    lambda: wandb.init(
                        mode=mode, settings=wandb.Settings(init_timeout=init_timeout, **settings), **kwargs
                    ),
                    patience_s=init_timeout,
                )
            except Exception as exc:  # noqa: BLE001 - any failure to reach the server
                if mode != "online":
                    raise
                first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                self.log.warning("W&B online init failed (%s); logging offline instead (`wandb sync` later)", first)
                run = wandb.init(mode="offline", settings=wandb.Settings(**settings), **kwargs)
            if self._given_up:
                return
            if self.identity is not None:
                define_metrics(run)
                self.identity.started()
            self.run = run
        except BaseException as exc:  # noqa: BLE001 - reported by ready(); training goes on
            self.error = exc
            self.log.warning(
                "W&B could not start (%s: %s); metrics.jsonl still has every logged step", type(exc).__name__, exc
            )

    @staticmethod
    def _init_while_id_in_use(init, *, patience_s: float):
        """``init()``, tried again while W&B answers that the run id is in use: a resumed or elastically
        restarted process reuses the id while the service of the process before it (stopped without
        ``finish``) may still hold it for a moment (seen: "run ID ... is in use" 2 s after the previous run)."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                return init()
            except Exception as exc:  # noqa: BLE001 - only "in use" is retried
                if "in use" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)

    def _start(self) -> None:
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def ready(self) -> bool:
        """Wait for the background init (at most ``init_timeout`` + ``answer_timeout_s``); True when a run is
        available."""
        if self._thread is not None:
            self._start()
            waited = self.init_timeout + self.answer_timeout_s
            self._thread.join(waited)
            if self._thread.is_alive():
                self._given_up, self.failed = True, True
                self.log.warning(
                    "W&B did not start within %g s (logger.wandb.init_timeout + logger.wandb.answer_timeout_s); "
                    "training goes on without W&B, metrics.jsonl has every step",
                    waited,
                )
            self._thread = None
        return self.run is not None

    @property
    def directory(self) -> str | None:
        return str(Path(self.run.dir).parent) if self.ready() else None

    def _guard(self, what: str, call, *, bounded: bool = True) -> None:
        """Run one call into wandb; on the first failure warn once and stop using W&B. ``bounded``: given up after
        ``answer_timeout_s`` (run on a helper thread; a logged step's ``log``, which only queues, runs directly)."""
        if self.run is None:
            return
        try:
            if bounded:
                _within(call, self.answer_timeout_s)
            else:
                call()
        except Exception as exc:  # noqa: BLE001 - W&B must never stop training
            self.run, self.failed = None, True
            self.log.warning(
                "W&B failed while %s (%s: %s); training goes on without W&B, metrics.jsonl has every step",
                what,
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
            )

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self._start()
        if self._thread is not None and self._thread.is_alive():
            self._pending.append((metrics, step))
            return
        if self.ready():
            for m, s in self._drain():
                self._log(m, s)
            self._log(metrics, step)

    def _drain(self) -> list[tuple[dict[str, Any], int]]:
        pending, self._pending = self._pending, []
        return pending

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is None:
            return
        if self.identity is None:
            numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            self._guard(f"logging step {step}", lambda: self.run.log(numbers, step=step), bounded=False)
            return
        if step <= self.identity.last_step:  # W&B has it from before a restart: once per step
            return

        def send() -> None:
            self.run.log(wandb_metrics(metrics), step=step)
            self._logged_step = step
            self.identity.logged(step)

        self._guard(f"logging step {step}", send, bounded=False)

    def log_summary(self, summary: dict[str, Any]) -> None:
        if not self.ready():
            return
        for m, s in self._drain():
            self._log(m, s)

        def write() -> None:
            for key, value in summary.items():
                if isinstance(value, (int, float, str)):
                    self.run.summary[key] = value

        self._guard("writing the summary", write)

    def log_files(self, *, images: dict[str, Path] | None = None, files: list[Path] | None = None) -> None:
        if not self.ready():
            return

        def upload() -> None:
            import wandb

            step = {"step": self._logged_step} if self._logged_step is not None else {}
            for key, path in (images or {}).items():  # on the last logged step's row, not a row of its own
                name = wandb_key(key) if self.identity is not None else key
                self.run.log({name: wandb.Image(str(path))}, **step)
            for path in files or []:
                self.run.save(str(path), base_path=str(path.parent), policy="now")

        self._guard("saving files", upload)

    def log_checkpoint(self, path: Path, *, step: int, loss: float | None, best: bool) -> None:
        """The checkpoint folder as a reference artifact (``file://`` URIs, nothing uploaded): one
        artifact per run, a version per checkpoint, aliases ``latest`` and (lowest loss so far) ``best``."""
        if not self.ready():
            return

        def log() -> None:
            import wandb

            art = wandb.Artifact(
                f"checkpoints-{self.run.id}",
                type="model",
                description="DCP checkpoint of a meshtrain run (by reference: the files stay in the run folder)",
                metadata={"step": step, "loss": loss, "path": str(path)},
            )
            art.add_reference(Path(path).resolve().as_uri(), name=Path(path).name, checksum=False)
            aliases = ["latest", f"step-{step}"] + (["best"] if best else [])
            self.run.log_artifact(art, aliases=aliases)

        self._guard(f"logging checkpoint {step}", log)

    def log_config(self, files: list[Path]) -> None:
        """The resolved config (and Hydra's own files) as a ``config`` artifact."""
        if not self.ready():
            return

        def log() -> None:
            import wandb

            art = wandb.Artifact(f"config-{self.run.id}", type="config")
            for path in files:
                if Path(path).is_file():
                    art.add_file(str(path), name=Path(path).name)
            self.run.log_artifact(art)

        self._guard("logging the config", log)

    def finish(self, exit_code: int = 0) -> None:
        if self.ready():
            for m, s in self._drain():
                self._log(m, s)
            self._guard("finishing the run", lambda: self.run.finish(exit_code=exit_code))
            import wandb

            # stop the service this process started and clear its WANDB_SERVICE, which processes started
            # from this one later would otherwise inherit (a report written in the caller's Python)
            self._guard("stopping W&B's service", wandb.teardown)
            self.run = None
