"""model.init_device under fsdp on 2 ranks: built on meta, sharded, then materialised per shard, no rank
ever holds the whole model; built on cpu, every rank does.

What is measured, per rank (``summary.json`` → ``model_init``): ``materialised_bytes_max``, the largest
parameter + buffer bytes the rank held at once while building (counted from the tensors: the full model
when built on cpu, the rank's shards when built on meta); ``local_param_bytes``, what it holds once built;
``build_peak_growth_bytes``, the growth of the process's peak resident set (Linux ``VmHWM``, reset when
the build starts) from the start of the build to the end of materialisation. The model (~152 MB of fp32
weights) exceeds the rank budget, so ``init_device=auto`` picks meta.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_fsdp_meta_build_never_holds_the_full_model(tmp_path):
    big = (
        "model=llama_debug",
        "model.n_layers=4",
        "model.d_model=768",
        "model.n_heads=8",
        "model.n_kv_heads=8",
        "model.d_ff=3072",
        "topology.device_memory_gb=0.12",  # budget 0.108 GB < 0.152 GB of fp32 weights: auto -> meta
        "optim=sgd",
    )
    sweep = tmp_path / "sweep"
    run = run_train(
        "parallel=fsdp",
        "model.init_device=auto,cpu",
        *big,
        *FAST,
        "data.global_batch_size=2",
        "data.seq_len=8",
        "trainer.max_steps=1",
        "trainer.checkpoint_every=0",
        run_dir=sweep,
        multirun=True,
    )
    assert "2 jobs: 2 completed" in run.output, run.output[-3000:]
    inits = {}
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["final_loss"] is not None
        inits[summary["model_init"]["init_device"]] = summary["model_init"]
    meta, cpu = inits["meta"], inits["cpu"]
    print("model_init meta:", meta, "cpu:", cpu)
    full = meta["full_fp32_bytes"]
    assert full > 0.108e9 and full == cpu["full_fp32_bytes"]
    # each rank holds half of every parameter, whichever way it was built
    for held in meta["local_param_bytes_per_rank"] + cpu["local_param_bytes_per_rank"]:
        assert held == pytest.approx(full / 2, rel=0.01)
    # built on cpu, every rank materialised the whole model at once; built on meta, only its shards
    assert all(b == pytest.approx(full, rel=0.01) for b in cpu["materialised_bytes_max_per_rank"]), cpu
    assert all(b == pytest.approx(full / 2, rel=0.01) for b in meta["materialised_bytes_max_per_rank"]), meta
    # and the process's memory agrees: the cpu build grew by at least the full model, the meta build less
    for grew_cpu, grew_meta in zip(cpu["build_peak_growth_bytes_per_rank"], meta["build_peak_growth_bytes_per_rank"]):
        assert grew_cpu >= full and grew_meta < full and grew_meta < grew_cpu, (cpu, meta)
