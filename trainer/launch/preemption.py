"""Preemption: SIGTERM (schedulers, ``scancel``, the elastic agent) and the time-limit warning signals.

The warning signals are SIGUSR1 (``sbatch --signal=USR1@...``) and, inside a submitit job (the Slurm
and local launchers of hydra-submitit-launcher), the signal the installed submitit asks Slurm for
(``--signal=USR2@<signal_delay_s>`` in submitit 1.5; read from submitit, not assumed). The handler only
sets a flag; it replaces submitit's own handler in the training process, which would otherwise run
its checkpoint-and-requeue in the middle of a collective. The loop checks the flag at each step
boundary with one all-reduce, so all ranks agree on the same last step, save a checkpoint there and
stop cleanly; the Slurm launcher then requeues the job (trainer/sweeps/slurm.py). The launcher
process forwards the warning signals to its workers (the elastic agent passes SIGTERM on itself).
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later (`trainer.resume=auto` continues)


def warning_signals(environ: dict[str, str] | None = None) -> tuple[signal.Signals, ...]:
    """SIGUSR1, plus submitit's time-limit/preemption signal when this process runs in a submitit job."""
    env = os.environ if environ is None else environ
    found = [signal.SIGUSR1]
    if "SUBMITIT_EXECUTOR" in env:
        from submitit.core.job_environment import JobEnvironment

        # JobEnvironment.USR_SIG honours SUBMITIT_PREEMPT_SIGNAL, as submitit's sbatch line does
        name = env.get("SUBMITIT_PREEMPT_SIGNAL", JobEnvironment.USR_SIG)
        sig = getattr(signal, "SIG" + name.upper().removeprefix("SIG"), None)
        if sig is not None and sig not in found:
            found.append(sig)
    return tuple(found)


def stop_signals(environ: dict[str, str] | None = None) -> tuple[signal.Signals, ...]:
    return (signal.SIGTERM, *warning_signals(environ))


class PreemptionFlag:
    """Set by the signal; if the step boundary is not reached within ``grace_s`` (a rank stuck in a
    collective, or hung), the process exits anyway so the job never waits on it.

    ``grace_s=None``: no watchdog. The Slurm launcher installs such a flag before the training starts
    (a short time limit can warn while the job is still importing); the training's own flag takes over
    what it caught when installed, so the loop stops after its first step instead of the warning
    going to submitit's handler (which requeued the job from scratch, again and again)."""

    def __init__(self, *, grace_s: float | None = 15.0) -> None:
        self.signum: int | None = None
        self.received: list[str] = []  # every stop signal seen, in order (SIGTERM means preemption)
        self.grace_s = grace_s
        self._previous: dict[int, object] = {}
        self._watchdog: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is None and self.grace_s is not None:
            self._watchdog = threading.Timer(self.grace_s, os._exit, args=(128 + signum,))
            self._watchdog.daemon = True
            self._watchdog.start()
        self.signum = signum
        name = signal.Signals(signum).name
        if name not in self.received:
            self.received.append(name)

    def honoured(self) -> None:
        """The loop reached a step boundary: saving may take as long as it needs."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def install(self) -> PreemptionFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in stop_signals():
                self._previous[sig] = previous = signal.signal(sig, self._handle)
                outer = getattr(previous, "__self__", None)
                if isinstance(outer, PreemptionFlag) and outer.requested:  # caught before this flag existed
                    self.signum = self.signum or outer.signum
                    self.received += [n for n in outer.received if n not in self.received]
        return self

    def uninstall(self) -> None:
        self.honoured()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


def forward_to_children(signum: int) -> None:
    """Send ``signum`` to every child process (the launcher's workers)."""
    import psutil

    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            child.send_signal(signum)
        except psutil.Error:
            pass
