"""Preemption: SIGTERM (schedulers, the elastic agent) and SIGUSR1 (Slurm's warning signal).

The handler only sets a flag; the loop checks it at each step boundary with one all-reduce, so all
ranks agree on the same last step, save a checkpoint there and stop cleanly. The launcher process
forwards SIGUSR1 to its workers (the elastic agent handles SIGTERM itself by passing it on).
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later (`trainer.resume=auto` continues)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    """Set by the signal; if the step boundary is not reached within ``grace_s`` (a rank stuck in a
    collective, or hung), the process exits anyway so the job never waits on it."""

    def __init__(self, *, grace_s: float = 15.0) -> None:
        self.signum: int | None = None
        self.grace_s = grace_s
        self._previous: dict[int, object] = {}
        self._watchdog: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self._watchdog = threading.Timer(self.grace_s, os._exit, args=(128 + signum,))
            self._watchdog.daemon = True
            self._watchdog.start()
        self.signum = signum

    def honoured(self) -> None:
        """The loop reached a step boundary: saving may take as long as it needs."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def install(self) -> PreemptionFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
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
