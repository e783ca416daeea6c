"""A hand-written torch hybrid loop, dp=2 x pp=2 on 4 ranks (torchrun): a (pp, dp) DeviceMesh; each pipeline
stage (2 blocks) sharded with FSDP2 over its dp group (blocks, then the stage root), driven by torch's
``Schedule1F1B`` with 4 micro-batches over the pp group; each replica takes its half of the global batch.
meshtrain's ``parallel=hybrid tp.size=1`` does the same (FSDP2 on dp when pp > 1). Shared parts:
``benchmarks/bare_common.py``."""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from benchmarks import bare_common as bare


def main() -> None:
    args = bare.parse_args(micro_batches=4, pp=2)
    rank, world, device = bare.init(args)
    mesh = init_device_mesh(device.type, (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh.get_coordinate()
    model = bare.pipeline_stage_module(args, stage=pp_rank, stages=args.pp, device=device)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    stage = PipelineStage(model, pp_rank, args.pp, device, group=mesh["pp"].get_group())
    schedule = Schedule1F1B(
        stage, n_microbatches=args.micro_batches, loss_fn=bare.microbatch_loss(args.micro_batches), scale_grads=False
    )
    opt = bare.adamw(model.parameters(), args)
    last = pp_rank == args.pp - 1
    step = bare.pipeline_train_step(
        schedule=schedule,
        model=model,
        opt=opt,
        data=bare.corpus(args),
        rows=bare.replica_rows(replica=dp_rank, replicas=world // args.pp, batch=args.batch),
        first=pp_rank == 0,
        last=last,
        max_norm=args.clip,
        device=device,
    )
    bare.timed_loop(args, step, report=last and dp_rank == 0)
    del model, opt, step, schedule, stage
    bare.close()


if __name__ == "__main__":
    main()
