"""Build the next steps' global batches in a background thread while the current step runs.

The batch of step k is still ``data.global_batch(k)``, a function of (seed, k) alone: the thread only
moves the work earlier, so every layout and a resumed run see the same batches. ``get(k)`` returns the
batch and the seconds the loop waited for it (``data_time_s``): near zero when the loader keeps ahead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Prefetcher:
    def __init__(self, make: Callable[[int], Any], *, first_step: int, last_step: int, depth: int = 2):
        self.make = make
        self.depth = depth
        self._next = first_step
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0 and first_step <= last_step:
            self._thread = threading.Thread(
                target=self._run, args=(first_step, last_step), name="meshtrain-prefetch", daemon=True
            )
            self._thread.start()

    def _run(self, first: int, last: int) -> None:
        for step in range(first, last + 1):
            if self._stop.is_set():
                return
            try:
                item = (step, self.make(step), None)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the loop's thread by get()
                item = (step, None, exc)
            # a blocking put, no polling: a put timing out every 0.1 s woke this thread 10 times a second for the
            # interpreter lock the training thread holds; close() sets the stop flag, then empties the queue
            self._queue.put(item)
            if item[2] is not None:
                return

    def get(self, step: int) -> tuple[Any, float]:
        """(batch of ``step``, seconds waited). Steps must be asked for in order."""
        t0 = time.perf_counter()
        if self._thread is None:  # depth 0: build it here (the whole time counts as waiting)
            batch = self.make(step)
            return batch, time.perf_counter() - t0
        got, batch, exc = self._queue.get()
        waited = time.perf_counter() - t0
        if exc is not None:
            raise exc
        if got != step:
            raise RuntimeError(f"prefetcher out of order: asked for step {step}, got {got}")
        return batch, waited

    def close(self) -> None:
        """Stop the thread: the flag first, then the queue emptied, so a put() waiting on a full queue returns and
        the thread sees the flag (a batch it was building then goes into the emptied queue, and it stops)."""
        self._stop.set()
        if self._thread is not None:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=5)
