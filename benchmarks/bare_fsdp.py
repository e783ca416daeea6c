"""A hand-written torch FSDP2 loop: ``fully_shard`` on each block, then the root (torchtitan's order, as
``parallel=fsdp``), 2 ranks under torchrun. Shared parts: ``benchmarks/bare_common.py``."""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from benchmarks import bare_common as bare


def main() -> None:
    args = bare.parse_args()
    rank, world, device = bare.init(args)
    mesh = init_device_mesh(device.type, (world,))
    model = bare.build_model(args, device=device)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    bare.run_replicated(args, model, rank=rank, world=world, device=device)
    del model
    bare.close()


if __name__ == "__main__":
    main()
