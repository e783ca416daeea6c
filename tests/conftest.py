"""Fixtures for every test under tests/ (unit and integration); plain helpers are in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

from tests.composing import lean_hydra, session_composer
from tests.helpers import CONF, make_train, run_train


def pytest_configure(config):
    """Each pytest-xdist worker computes on one torch thread (``make test`` and ``make test-unit`` run two workers on
    the two cores; torch's default is a thread per core, so each worker's threads contend for the cores the other
    worker is using). make test-unit's command, three alternating runs under load: 42.2-45.2 user CPU s with one
    thread, 46.2-48.2 s with torch's default. Processes the tests start are left alone (their environment is
    unchanged; a run sets its own ``topology.threads_per_rank``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _composer(tmp_path_factory):
    """One per session; the resolvers and schemas are registered once (24 ms a time, measured). Under xdist the
    workers share their compositions through the session's temporary folder (tests/composing.py)."""
    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()
    composer = session_composer(CONF)  # tests/planning.py composes through it too
    if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is <the session's folder>/popen-gwN
        composer.shared = tmp_path_factory.getbasetemp().parent / "compositions"
        composer.shared.mkdir(exist_ok=True)
    return composer


@pytest.fixture
def compose_cfg(_composer):
    """Compose conf/ with overrides, as Hydra would for train.py (no process started); each set of group
    choices is composed once per session (tests/composing.py), every call gets its own copy."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def initialize():
        GlobalHydra.instance().clear()
        return initialize_config_dir(config_dir=str(CONF), version_base="1.3")

    def _compose(*overrides: str, return_hydra_config: bool = False):
        if not return_hydra_config:
            return _composer(overrides, initialize=initialize)
        with lean_hydra(), initialize():  # Hydra's compose less the work it repeats (tests/composing.py)
            return compose("config", overrides=list(overrides), return_hydra_config=True)

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm on this machine (benchmarks/slurm_cluster.py), started once for the `slurm` tests.

    Installs Debian's packages if they are missing (CI: .ci/run does it first). If Slurm cannot start, the
    tests fail with the daemons' logs: they are never skipped in silence.
    """
    from benchmarks.slurm_cluster import SlurmUnavailable, start, stop

    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = start(root, install_missing=True)
    except SlurmUnavailable as exc:
        pytest.fail(f"the one-node Slurm for the `slurm` tests did not start: {exc}", pytrace=False)
    print(f"\none-node Slurm up in {cluster.setup_s:.1f} s ({cluster.conf})")
    yield cluster
    stop(root)


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """``parallel=single`` runs shared by the whole session, one per set of overrides: the parity tests of
    several modules compare against the same reference, which then runs once."""
    runs = {}

    def get(*overrides: str):
        if overrides not in runs:
            folder = tmp_path_factory.mktemp("reference") / "run"
            runs[overrides] = run_train("parallel=single", *overrides, run_dir=folder)
        return runs[overrides]

    return get


@pytest.fixture(scope="session")
def default_job(tmp_path_factory):
    """The README's default job, ``make train`` as printed (DDP on 2 processes, 200 steps), run once per session:
    test_readme_commands reads its outputs back, exports it and decodes with it (one module: one xdist worker runs it)."""
    return make_train(run_dir=tmp_path_factory.mktemp("default_job") / "run")
