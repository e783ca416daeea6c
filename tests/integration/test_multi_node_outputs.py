"""Two "nodes" on localhost, each in its own run folder (nodes without a shared filesystem): node 0 holds
global rank 0 whatever the join order; checkpointing is refused with the fix; a lone node gives up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import FAST, ROOT, run_train

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def node(k: int, port: int, run_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "topology=multi_node",
        "topology.nnodes=2",
        "topology.nproc_per_node=1",
        f"topology.master_port={port}",
        f"topology.node_rank={k}",
        *FAST,
        "trainer.max_steps=3",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """Read the node's output until ``needle`` appears (it is then waiting at the rendezvous)."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"no {needle!r} from the node: {''.join(seen)[-2000:]}")


def two_nodes_node1_first(tmp_path: Path, *extra: str) -> tuple[list[subprocess.Popen], list[str]]:
    port = free_port()
    first = node(1, port, tmp_path / "node1", *extra, "topology.rendezvous_timeout_s=200")
    said = wait_for_line(first, "waiting for node(s) 0")
    time.sleep(1.0)  # node 1 waits for the rendezvous before node 0 even starts
    second = node(0, port, tmp_path / "node0", *extra, "topology.rendezvous_timeout_s=200")
    out0, _ = second.communicate(timeout=300)
    out1, _ = first.communicate(timeout=300)
    return [second, first], [out0, "".join(said) + out1]


def test_node_rank_0_holds_rank_0_in_separate_folders(tmp_path):
    (n0, n1), (out0, out1) = two_nodes_node1_first(tmp_path, "trainer.checkpoint_every=0")
    assert (n0.returncode, n1.returncode) == (0, 0), out0[-3000:] + out1[-3000:]
    assert "node 1 of 2: joining node 0 at localhost:" in out1 and "waiting for node(s) 0" in out1
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    assert (node0 / "summary.json").exists() and len((node0 / "metrics.jsonl").read_text().splitlines()) == 3
    assert not (node1 / "metrics.jsonl").exists() and not (node1 / "summary.json").exists()
    assert (node0 / "logs" / "rank0.log").exists() and (node1 / "logs" / "rank1.log").exists()
    assert "do not see node 0's run folder" in (node0 / "logs" / "rank0.log").read_text()
    import json

    rows = json.loads((node0 / "summary.json").read_text())["layout"]["rank_map"]
    assert [(r["rank"], r["node"]) for r in rows] == [(0, 0), (1, 1)]


def test_separate_folders_refuse_checkpointing_with_the_fix(tmp_path):
    (n0, n1), (out0, out1) = two_nodes_node1_first(tmp_path, "trainer.checkpoint_every=2")
    assert n0.returncode != 0 and n1.returncode != 0
    for out in (out0, out1):
        assert "do not see node 0's run folder" in out, out[-3000:]
        assert "hydra.run.dir=<a path all nodes mount>" in out and "trainer.checkpoint_every=0" in out
    assert "saved" not in out0 + out1
    assert not list((tmp_path / "node0").glob("checkpoints/step_*"))


def test_a_lone_node_gives_up_after_the_rendezvous_timeout(tmp_path):
    """Node 0 alone, then node 1 alone (each on its own port), forked from the warm runner: the same train.py; the
    interpreter's start is the other tests' (cold nodes)."""
    for k in (0, 1):
        # a node that ignored rendezvous_timeout_s=5 would wait the default 600 s: the 300 s timeout catches it
        run = run_train(
            "topology=multi_node",
            "topology.nnodes=2",
            "topology.nproc_per_node=1",
            f"topology.master_port={free_port()}",
            f"topology.node_rank={k}",
            *FAST,
            "trainer.max_steps=3",
            "topology.rendezvous_timeout_s=5",
            run_dir=tmp_path / f"n{k}",
            expect_ok=False,
            timeout=300,
        )
        out = run.output
        assert run.proc.returncode == 3, out[-3000:]
        assert f"node {k} of 2" in out and "waiting for node(s)" in out
        assert "the rendezvous at localhost:" in out and "rendezvous_timeout_s=5" in out
        assert "Traceback" not in out and "frame #" not in out, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("meshtrain:")]
        assert len(errors) == 1, errors
