"""``python train.py ARGS`` without paying the interpreter's imports each time: a warm runner for the tests.

A zygote process (``python -m tests.warm_runner``) imports what every run imports (Hydra, the configs, torch,
torch.distributed, ``torch._dynamo`` and inductor, the trainer, matplotlib for the figures) once, then forks one
child per request. The child is the ``train.py`` process a user would start: it takes the request's folder,
environment, argv and output files and runs train.py as ``__main__`` (``runpy``), so Hydra composes, validates and
launches exactly as on the command line; its workers fork from it in turn (``topology.start_method=auto``). What
it skips is only the ~6 s of imports per run that make up most of a short test run on 2 cores.

The zygote runs no torch kernel (a forked child would inherit a used OpenMP pool) and starts no Python thread (the
BLAS libraries that numpy and scipy load start their own pools, which they stop and restart around a fork). Tests that
start ``python train.py`` cold (the user-facing paths: make, torchrun, the ``meshtrain`` command, Slurm,
submitit, signals sent mid-run) do not come here.
"""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import resource
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN_PY = ROOT / "train.py"

#: imported once in the zygote: everything a train.py run and its workers import before the first step
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "torch.distributed.pipelining",
    "torch.distributed.elastic.multiprocessing",
    "torch.distributed.launcher.api",
    "torch._dynamo",
    # what the first torch.compile(...) call imports (~1.3 s CPU per rank of a trainer.compile=true run); no pool
    # or thread is started by the import
    "torch._inductor.compile_fx",
    "hydra",
    "conf.schema",
    "trainer.task",
    "trainer.launch.launcher",
    "trainer.launch.worker",
    "trainer.loop.fit",
    "parallel.strategies",
    "models.gpt.model",
    "models.llama.model",
    # the run's figures (rank map, pipeline timeline, expert load) are drawn by rank 0 at the end: importing
    # matplotlib there cost ~0.6 s CPU per run (a worker forked from a job that never drew one imports it anew)
    "matplotlib.pyplot",
    # what each run imported anew after those (measured, sys.modules before and after a run): the command (which
    # registers the schemas), Hydra's launchers and sweepers found by its plugin scan, the layout's assembly and the
    # checkpointer with fsspec's file system (each worker of a run imported these again: ~0.1 s CPU a rank)
    "trainer.command",
    "hydra._internal.core_plugins.basic_launcher",
    "hydra._internal.core_plugins.basic_sweeper",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
    "hydra_plugins.meshtrain_launcher.meshtrain_launcher",
    "parallel.assembly.build",
    "trainer.checkpoint.checkpointer",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.checkpoint._fsspec_filesystem",
    "trainer.data.datasets",
    "trainer.observe.wandb_run",
    "trainer.sweeps.callback",
    "trainer.launch.ownership",
    # a run from a Hugging Face folder (model.init_from, model=hf, data=chat's tokenizer) imported transformers'
    # modelling code in its launcher process (with scipy, accelerate, torchao: ~2.8 s CPU measured, every such launch)
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
)


# ---- the zygote ------------------------------------------------------------------------------------------


def _child(request: dict) -> int:
    """In the forked child: become ``python train.py ARGS`` in the request's folder and environment."""
    os.setpgid(0, 0)  # its own group: a timed-out run is killed with its workers
    if request.get("max_file_bytes"):  # RLIMIT_FSIZE, as a shell's ulimit -f: writes past it fail with EFBIG
        limit = int(request["max_file_bytes"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # the process's own stdin (devnull)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.argv = [str(TRAIN_PY), *request["args"]]
    sys.path[0] = str(TRAIN_PY.parent)  # as `python train.py` sets it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        runpy.run_path(str(TRAIN_PY), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, exit code 1
        traceback.print_exc()
        code = 1
    # what the interpreter does at exit: wait for non-daemon threads, run atexit (logging, W&B), flush
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve() -> None:
    """Read one JSON request per line on stdin; answer ``{"pid": ...}`` then ``{"returncode": ...}``."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")  # what the figures' code selects before importing pyplot (no display here)
    for name in PRELOAD:
        importlib.import_module(name)
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's scan of hydra_plugins/ (~0.09 s CPU), done once here instead of in every run
    # what was imported here lives as long as every run: left out of the runs' collections (the launcher's full
    # collection before it forks its workers, trainer/launch/start_method.py, traversed it: 0.23-0.26 s CPU a launch)
    # and never written by them (no copy-on-write of its pages in the forked runs)
    gc.collect()
    gc.freeze()
    reply = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=reply, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request)
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


# ---- the client (pytest's process) -------------------------------------------------------------------------


class WarmRunner:
    """Client of one zygote; started on first use, one per pytest session (``runner()``)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        ready = self._read(timeout=300)
        assert "ready" in ready, ready

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"the warm runner gave no answer within {timeout:.0f}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm runner exited ({self.proc.poll()})")
        return json.loads(line)

    def run(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        tmp: Path,
        max_file_bytes: int | None = None,
    ):
        tmp.mkdir(parents=True, exist_ok=True)
        stdout, stderr = tmp / "stdout.txt", tmp / "stderr.txt"
        request = {"args": args, "cwd": str(cwd), "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        request["max_file_bytes"] = max_file_bytes
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._read(timeout=60)["pid"]
        try:
            code = self._read(timeout=timeout)["returncode"]
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            self._read(timeout=60)
            raise subprocess.TimeoutExpired([str(TRAIN_PY), *args], timeout) from None
        return subprocess.CompletedProcess(
            [sys.executable, str(TRAIN_PY), *args], code, stdout.read_text(), stderr.read_text()
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_RUNNER: WarmRunner | None = None


def runner() -> WarmRunner:
    global _RUNNER
    if _RUNNER is None or _RUNNER.proc.poll() is not None:
        _RUNNER = WarmRunner()
        atexit.register(_RUNNER.close)
    return _RUNNER


if __name__ == "__main__":
    serve()
