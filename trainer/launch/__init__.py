"""Starting workers: in-process, torch's elastic agent, or an external torchrun/Slurm; restarts and preemption."""
