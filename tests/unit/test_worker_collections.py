"""trainer/launch/worker.py: a worker's collections leave out what it had before the run (``gc.freeze`` at ``run``'s
start), and its teardown still frees the run's cycles (a DDP module's) before the process group goes."""

from __future__ import annotations

import gc
import weakref

from trainer.launch.worker import _teardown


class _Cycle:
    def __init__(self):
        self.me = self


def test_teardown_frees_the_runs_cycles_and_nothing_stays_frozen():
    before_run = _Cycle()  # built before the run: frozen, so no collection of the run may free it
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        made_by_run = _Cycle()
        ref, kept = weakref.ref(made_by_run), weakref.ref(before_run)
        del made_by_run, before_run
        _teardown([])
        assert ref() is None  # the run's cycle went before the group would have
        assert gc.get_freeze_count() == 0  # a process that goes on collects as before
        assert kept() is not None  # frozen at the collection: left alone, collectable from now on
        gc.collect()
        assert kept() is None
    finally:
        gc.unfreeze()
