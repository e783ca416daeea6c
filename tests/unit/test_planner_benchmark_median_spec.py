"""The planner benchmark keeps each calibrated quantity's median over several calibrations."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.planner import median_spec
from parallel.plan.specs import HardwareSpec, Link


def _spec(flops: float, gbps: float, bucket_us: float) -> HardwareSpec:
    link = Link(gbps, 1e-4)
    return HardwareSpec(
        name="local_cpu",
        nnodes=1,
        devices_per_node=2,
        device="cpu",
        memory_bytes=8e9,
        flops=flops,
        memory_bytes_per_s=3e9,
        intra=link,
        inter=link,
        p2p=Link(20.0, 5e-5),
        ddp_bucket_s=bucket_us * 1e-6,
        measured={"tflops": flops / 1e12, "ddp_bucket_us": bucket_us},
    )


def test_every_number_is_the_median_and_the_rest_is_kept():
    specs = [_spec(6e10, 9.0, 0.0), _spec(7e10, 12.0, 16_164.0), _spec(6.5e10, 10.0, 3_690.0)]
    got = median_spec(specs)
    assert got.flops == 6.5e10 and got.intra == Link(10.0, 1e-4) and got.inter == Link(10.0, 1e-4)
    assert got.ddp_bucket_s == 3_690.0 * 1e-6
    assert got.measured == {"tflops": 0.065, "ddp_bucket_us": 3_690.0}
    assert got.name == "local_cpu" and got.nnodes == 1 and got.device == "cpu"
    one = replace(specs[0])
    assert median_spec([one]) == one
