"""DPO on preference pairs under every layout (real workers, one multirun): a tiny Qwen3 saved by transformers with a
ChatML template, 40 conversational pairs, 3 steps. Each case prepares its own cache, so each computes the reference
log-probabilities through its own engine before its first step. Full weights: ddp (2 accumulated chunks per
replica), fsdp, tp (loss parallel) and dp 2 x pp 2 (1F1B, the chosen and rejected of a pair in one micro-batch)
reproduce single's losses, reward margins, log-probabilities and gradient norms to 1e-6 relative (the rewards to
1e-6 of the log-probabilities they are differences of), its accuracies and held-out loss, and so do dp 2 x pp 2 with
the reference held on the ranks (``trainer.preference.reference=copy``: a frozen copy of the initial weights run on
every batch) and dp 2 x cp 2 (each row's tokens split over the cp ranks, its log-probability summed over them); with
LoRA (the reference: the base with the adapters off), fsdp and plain pp 2 reproduce lora single's and step 1 is ln 2;
a Qwen3-MoE under dp 2 x ep 2 reproduces its single's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.chat_helpers import VOCAB, sentence, write_jsonl, write_tokenizer
from tests.helpers import assert_losses_close, case_multirun, run_train
from tests.hf_helpers import hf_model, save_folder

pytestmark = pytest.mark.slow

SEQ = 64
LORA = {"lora": {"rank": 8, "alpha": 16.0, "targets": ["wq", "wv", "w2"]}}
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "ddp": {"defaults": [{"override /parallel": "ddp"}], "data": {"micro_batch_size": 2}},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "tp": {"defaults": [{"override /parallel": "tp"}], "tp": {"loss_parallel": True}},
    "dp2_pp2": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 2, "micro_batches": 2, "schedule": "1f1b"},
    },
    # the reference held on the ranks (trainer.preference.reference=copy): the initial weights' frozen shards
    # swapped in for a forward on every batch, through FSDP2 over dp 2 and the pipeline's stages
    "copy_dp2_pp2": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 2, "micro_batches": 2, "schedule": "1f1b"},
        "trainer": {"preference": {"reference": "copy"}},
    },
    # context parallel beside dp: each row's tokens split over 2 ranks, its log-probability summed over them
    "dp2_cp2": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "cp": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 1},
    },
    "lora_single": {"defaults": [{"override /parallel": "single"}], "model": LORA},
    "lora_fsdp": {"defaults": [{"override /parallel": "fsdp"}], "model": LORA},
    # plain pp 2 with LoRA: the reference pass runs the base (adapters off) through the stages
    "lora_pp2": {
        "defaults": [{"override /parallel": "pp"}],
        "pp": {"size": 2, "micro_batches": 2, "schedule": "1f1b"},
        "model": LORA,
    },
    # a Qwen3-MoE folder (8 experts, 2 a token): expert parallel over 2 ranks borrowed from dp 2
    "moe_single": {"defaults": [{"override /parallel": "single"}], "moe": True},
    "moe_dp2_ep2": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 2},
        "ep": {"size": 2},
        "tp": {"size": 1},
        "pp": {"size": 1},
        "moe": True,
    },
}
COMPARED = ("loss", "grad_norm", "rewards_margin", "logps_chosen", "logps_rejected")
#: a reward is beta x (policy - reference) log-probability: a difference of two sums of ~60 nats, so float32's rounding
#: of the sums (1e-7 of them) is held to 1e-6 of the log-probability, not of the (hundredths-small) reward
REWARDS = (("rewards_chosen", "logps_chosen"), ("rewards_rejected", "logps_rejected"))


def preference_pairs(n: int, *, seed: int = 0) -> list[dict]:
    """Conversational pairs: the chosen reply one fixed sentence, the rejected a random one (a preference to learn)."""
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt": [{"role": "user", "content": sentence(rng, int(rng.integers(3, 7)))}],
            "chosen": [{"role": "assistant", "content": "The answer is the pipeline."}],
            "rejected": [{"role": "assistant", "content": sentence(rng, int(rng.integers(2, 6)))}],
        }
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    shape = {"vocab_size": VOCAB, "max_position_embeddings": SEQ, "num_key_value_heads": 2, "head_dim": 32}
    folder = write_tokenizer(save_folder(hf_model("qwen3", **shape), root / "qwen3"))
    write_tokenizer(save_folder(hf_model("qwen3_moe", **shape), root / "qwen3_moe"))
    return folder, write_jsonl(root / "pairs.jsonl", preference_pairs(40))


@pytest.fixture(scope="module")
def runs(start, tmp_path_factory):
    folder, pairs = start
    cases = {}
    for name, case in LAYOUTS.items():
        case = dict(case)
        init = folder.parent / ("qwen3_moe" if case.pop("moe", False) else "qwen3")
        data = {"path": str(pairs), "cache_dir": str(folder.parent / "cache" / name), **case.get("data", {})}
        cases[name] = {**case, "data": data, "model": {"init_from": str(init), **case.get("model", {})}}
    return case_multirun(
        cases,
        "data=preference",
        "trainer.objective=dpo",
        f"data.seq_len={SEQ}",
        "data.global_batch_size=8",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=3",
        "trainer.eval_batches=1",
        "trainer.checkpoint_every=0",
        "optim.lr=0.01",
        "logger=none",
        base=tmp_path_factory.mktemp("runs"),
        group="pref",
        timeout=900,
    )


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_step_one_is_ln2_and_the_held_out_pairs_are_scored(runs):
    for name in ("single", "copy_dp2_pp2", "lora_single", "lora_fsdp", "lora_pp2"):
        first = metrics(runs[name])[0]
        assert first["loss"] == pytest.approx(math.log(2), rel=1e-6)  # the policy is its reference
        assert first["rewards_margin"] == 0.0 and first["rewards_accuracy"] == 0.0
    last = metrics(runs["single"])[-1]
    print("single:", {k: last[k] for k in ("loss", "rewards_margin", "rewards_accuracy", "val_loss",
                                            "val_rewards_margin", "val_rewards_accuracy")})  # fmt: skip
    assert last["loss"] < math.log(2) and last["rewards_margin"] > 0
    assert {"val_loss", "val_rewards_accuracy", "val_ref_logps_chosen"} <= set(last)
    summary = json.loads((runs["single"] / "summary.json").read_text())
    assert summary["reference"]["reference"] == "initial weights"
    assert json.loads((runs["lora_fsdp"] / "summary.json").read_text())["reference"]["reference"] == "adapters off"
    copy = json.loads((runs["copy_dp2_pp2"] / "summary.json").read_text())["reference"]
    assert copy["reference"] == "frozen copy of the initial weights" and copy["reference_bytes_per_rank"] > 0


@pytest.mark.parametrize("case, ref", [("ddp", "single"), ("fsdp", "single"), ("tp", "single"),
                                       ("dp2_pp2", "single"), ("copy_dp2_pp2", "single"), ("dp2_cp2", "single"),
                                       ("lora_fsdp", "lora_single"), ("lora_pp2", "lora_single"),
                                       ("moe_dp2_ep2", "moe_single")])  # fmt: skip
def test_layouts_reproduce_single(runs, case, ref):
    got, want = metrics(runs[case]), metrics(runs[ref])
    assert len(got) == len(want) == 3
    for key in COMPARED:
        print(f"{case} {key}: {[m[key] for m in got]}, {ref}: {[m[key] for m in want]}")
        if key == "rewards_margin":  # step 1's margin is 0 exactly in both
            assert got[0][key] == want[0][key] == 0.0
            assert_losses_close([m[key] for m in got[1:]], [m[key] for m in want[1:]], rel=1e-6)
        else:
            assert_losses_close([m[key] for m in got], [m[key] for m in want], rel=1e-6)
    for key, scale in REWARDS:
        for step, (g, w) in enumerate(zip(got, want), start=1):
            assert abs(g[key] - w[key]) <= 1e-6 * abs(w[scale]), (case, key, step, g[key], w[key])
    assert [m["rewards_accuracy"] for m in got] == [m["rewards_accuracy"] for m in want]
    assert got[-1]["val_loss"] == pytest.approx(want[-1]["val_loss"], rel=1e-6)
    assert got[-1]["val_rewards_margin"] == pytest.approx(want[-1]["val_rewards_margin"], rel=1e-6)


def test_a_bad_pair_is_refused_before_any_worker(start, tmp_path):
    folder, _ = start
    bad = write_jsonl(tmp_path / "bad.jsonl", [*preference_pairs(3), {"prompt": "Why?", "chosen": "Yes."}])
    common = ("data=preference", "trainer.objective=dpo", f"model.init_from={folder}", f"data.seq_len={SEQ}",
              "data.global_batch_size=4", "logger=none", f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    run = run_train("parallel=ddp", f"data.path={bad}", *common, run_dir=tmp_path / "run", expect_ok=False)
    assert run.proc.returncode == 2, run.output[-3000:]
    assert f'{bad}:4: no "rejected" field' in run.output
    assert not (tmp_path / "run" / "logs" / "rank0.log").exists()
