"""Who started this process? torchrun/torchelastic, Slurm's srun, or the user's shell.

Torch-free on purpose: the launcher asks before it decides whether to import torch and start workers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ExternalLaunch:
    """Rank information given by an outer launcher; the worker then runs in this very process."""

    kind: str  # "torchrun", "slurm" or "submitit_local"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def detect_external_launch(environ: dict[str, str] | None = None) -> ExternalLaunch | None:
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env):
        world = int(env.get("WORLD_SIZE", "1"))
        return ExternalLaunch(
            kind="torchrun",
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=world,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        )
    # srun starting one task per worker (e.g. hydra-submitit-launcher with tasks_per_node = devices).
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        world = int(env["SLURM_NTASKS"])
        nnodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
        return ExternalLaunch(
            kind="slurm",
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=world,
            local_world_size=max(1, world // max(1, nnodes)),
        )
    # submitit's local executor with tasks_per_node > 1 (hydra/launcher=submitit_local): the Slurm layout,
    # one task per worker on this machine, under submitit's own names (it sets no SLURM_* variables).
    if "SUBMITIT_LOCAL_GLOBALID" in env and int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
        world = int(env["SUBMITIT_LOCAL_NTASKS"])
        return ExternalLaunch(
            kind="submitit_local",
            rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
            local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", "0")),
            world_size=world,
            local_world_size=world,
        )
    return None


def rendezvous_port(job_id: str) -> int:
    """The TCP store port of a job started by Slurm or submitit: the same on every task, from the job id."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return 20000 + int(digits) % 20000
