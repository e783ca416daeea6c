"""A hand-written torch DDP loop: the baseline ``python train.py parallel=ddp`` is measured against (run
under torchrun, 2 ranks). What it shares with the other baselines: ``benchmarks/bare_common.py``."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks import bare_common as bare


def main() -> None:
    args = bare.parse_args()
    rank, world = bare.init(args)
    model = DDP(bare.build_gpt(args))
    opt = bare.adamw(model.parameters(), args)
    step = bare.module_train_step(
        model=model,
        opt=opt,
        data=bare.corpus(args),
        rows=bare.replica_rows(replica=rank, replicas=world, batch=args.batch),
        clip=bare.torch_clip(model.parameters(), args.clip),
    )
    bare.timed_loop(args, step, report=rank == 0)
    del model, opt, step
    bare.close()


if __name__ == "__main__":
    main()
