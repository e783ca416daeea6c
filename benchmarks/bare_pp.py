"""A hand-written torch pipeline loop: 2 stages of 2 blocks each (embeddings on the first, norm and head
on the last), torch's own ``Schedule1F1B`` with 4 micro-batches, as ``parallel=pp``, 2 ranks under
torchrun. Shared parts: ``benchmarks/bare_common.py``."""

from __future__ import annotations

from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from benchmarks import bare_common as bare


def main() -> None:
    args = bare.parse_args(micro_batches=4)
    rank, world, device = bare.init(args)
    model = bare.pipeline_stage_module(args, stage=rank, stages=world, device=device)
    stage = PipelineStage(model, rank, world, device)
    schedule = Schedule1F1B(
        stage, n_microbatches=args.micro_batches, loss_fn=bare.microbatch_loss(args.micro_batches), scale_grads=False
    )
    opt = bare.adamw(model.parameters(), args)
    last = rank == world - 1
    step = bare.pipeline_train_step(
        schedule=schedule,
        model=model,
        opt=opt,
        data=bare.corpus(args),
        rows=slice(0, args.batch),
        first=rank == 0,
        last=last,
        max_norm=args.clip,
        device=device,
    )
    bare.timed_loop(args, step, report=last)
    del model, opt, step, schedule, stage
    bare.close()


if __name__ == "__main__":
    main()
