"""A hand-written torch DDP loop: the baseline ``python train.py parallel=ddp`` is measured against (run
under torchrun, 2 ranks). What it shares with the other baselines: ``benchmarks/bare_common.py``."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks import bare_common as bare


def main() -> None:
    args = bare.parse_args()
    rank, world, device = bare.init(args)
    model = DDP(bare.build_model(args, device=device))
    bare.run_replicated(args, model, rank=rank, world=world, device=device)
    del model
    bare.close()


if __name__ == "__main__":
    main()
