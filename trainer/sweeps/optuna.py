"""hydra-optuna-sweeper's sweeper, ending a study in which no trial completed the way every meshtrain sweep
ends: the sweep summary (counts and each skipped job's reason, trainer/sweeps/callback.py) and an exit code,
instead of Optuna's ``ValueError: No trials are completed yet`` traceback from ``study.best_trial``.

Put in place of the plugin's by the sweep-status callback (trainer/sweeps/callback.py) whenever
``hydra/sweeper=optuna`` is chosen.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

log = logging.getLogger("meshtrain.sweep")

#: what optuna's storage raises when the study is asked for its best trial and none completed
NO_COMPLETED_TRIAL = "No trials are completed yet"


class EndingOptunaSweeper(OptunaSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        try:
            return super().sweep(arguments)
        except ValueError as exc:
            if NO_COMPLETED_TRIAL not in str(exc):
                raise
            # the jobs' folders say why each ended; the sweep-status callback prints them and sets the exit code
            log.warning("optuna: no trial completed, so the study has no best value (no optimization_results.yaml)")
            return None
