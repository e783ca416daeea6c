"""One owner per run folder (trainer/launch/ownership.py), in process: only rank 0 / node 0 takes it. (The lock
against a helper process, taken again by its own process, and the refusal of a whole second train.py job:
tests/integration/test_run_folder_ownership.py.)"""

from __future__ import annotations

from trainer.launch.ownership import owns_folders


def test_only_global_rank_0_or_node_0_owns_the_folder():
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    assert not owns_folders(node_rank=0, environ=torchrun)
    assert owns_folders(node_rank=0, environ={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    srun = {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
    assert not owns_folders(node_rank=0, environ=srun)
    assert owns_folders(node_rank=0, environ={**srun, "SLURM_PROCID": "0"})
    assert owns_folders(node_rank=0, environ={}) and not owns_folders(node_rank=1, environ={})
