"""data=preference and the preference objectives in one process: TRL's three line forms read and tokenized as TRL
splits them, bad lines refused with file:line, pairs kept adjacent with their reference column, the DPO and SimPO
losses' formulas. The anchor, meshtrain's DPO loss and rewards equal to TRL's DPOTrainer's on the same pairs, is
tests/system/test_preference_vs_trl.py (it builds TRL's trainer)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from models.objectives import PreferenceObjective
from models.preference import PreferenceLoss, mean_stats
from tests.chat_helpers import PREFERENCE_SEQ as SEQ
from tests.chat_helpers import preference_data as data_of
from tests.chat_helpers import preference_pairs as pairs
from tests.chat_helpers import write_tokenizer
from trainer.data.preference import parse_pair
from trainer.data.shards import DataError


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


def test_trl_forms_read_to_the_same_messages():
    conv = pairs(1)[0]
    user, yes, no = conv["prompt"], conv["chosen"], conv["rejected"]
    assert parse_pair(json.dumps(conv)) == (user, yes, no)
    implicit = {"chosen": user + yes, "rejected": user + no}  # TRL's implicit prompt: the common messages
    assert parse_pair(json.dumps(implicit)) == (user, yes, no)
    text = {"prompt": "Why?", "chosen": "Because.", "rejected": "No."}
    assert parse_pair(json.dumps(text)) == (
        [{"role": "user", "content": "Why?"}],
        [{"role": "assistant", "content": "Because."}],
        [{"role": "assistant", "content": "No."}],
    )
    # strings with the prompt implicit: the common characters, the space before the split left to the completions
    got = parse_pair(json.dumps({"chosen": "Sky is blue", "rejected": "Sky is green"}))
    assert got[0][0]["content"] == "Sky is" and got[1][0]["content"] == " blue"


def test_bad_lines_are_refused_with_file_and_line(tokenizer, tmp_path):
    rows = pairs(2) + [
        {"prompt": "Why?", "chosen": "Yes."},
        {"prompt": "Why?", "chosen": " ", "rejected": "No."},
        {"prompt": "Why? " * 60, "chosen": "Yes.", "rejected": "No."},
        "not json",
    ]
    data = data_of(rows, tokenizer, tmp_path)
    with pytest.raises(DataError) as err:
        data.prepare()
    message, path = str(err.value), tmp_path / "pairs.jsonl"
    assert "4 pair(s) refused" in message
    assert f'{path}:3: no "rejected" field' in message
    assert f"{path}:4: the chosen completion is empty" in message
    assert f"{path}:5: prompt + chosen is" in message and f"longer than data.seq_len + 1 = {SEQ + 1}" in message
    assert f"{path}:6: not JSON" in message
    # the long prompt cut to its last tokens (data.max_prompt_len) fits
    data_of([*pairs(2), rows[4]], tokenizer, tmp_path / "cut", max_prompt_len=20).prepare()


def test_batches_keep_pairs_adjacent_with_the_reference_column(tokenizer, tmp_path):
    data = data_of(pairs(6), tokenizer, tmp_path)
    data.prepare()
    ref = np.arange(12, dtype=np.float64) - 100.5
    data.set_reference("train", ref)
    x, y = data.global_batch(3)
    assert x.shape == (4, SEQ) and y.shape == (4, SEQ + 1)
    got = y[:, -1].contiguous().view(torch.float64).numpy()
    sequences = (got + 100.5).astype(int)
    assert all(sequences[0::2] % 2 == 0) and all(sequences[1::2] == sequences[0::2] + 1)  # chosen, its rejected
    prompt = (y[:, :-1] == -100) & (x != data.metadata["tokenizer"]["pad_id"])
    assert torch.equal(x[0][prompt[0]], x[1][prompt[1]])  # one prompt, two completions


def test_dpo_and_simpo_formulas():
    logps = torch.tensor([-10.0, -12.0, -7.0, -5.0])
    lengths = torch.tensor([4, 6, 2, 5])
    ref = torch.tensor([-11.0, -11.0, -6.0, -6.0], dtype=torch.float64)
    beta, eps = 0.5, 0.1
    dpo = PreferenceLoss(PreferenceObjective(name="dpo", beta=beta, label_smoothing=eps))
    losses, stats = dpo.pair_losses(logps, lengths, ref)
    deltas = [(-10 + 11) - (-12 + 11), (-7 + 6) - (-5 + 6)]
    want = [-(1 - eps) * math.log(1 / (1 + math.exp(-beta * d))) - eps * math.log(1 / (1 + math.exp(beta * d)))
            for d in deltas]  # fmt: skip
    assert losses.tolist() == pytest.approx(want, rel=1e-6)
    means = mean_stats(stats)
    assert means["rewards_chosen"] == pytest.approx(beta * ((-10 + 11) + (-7 + 6)) / 2)
    assert means["rewards_accuracy"] == 0.5 and means["ref_logps_rejected"] == -8.5
    same = dpo.pair_losses(logps, lengths, logps.double())[0]  # the policy is its reference: ln 2 (eps aside)
    assert same.tolist() == pytest.approx([math.log(2)] * 2)
    simpo = PreferenceLoss(PreferenceObjective(name="simpo", beta=2.0, gamma=0.5))
    losses, _ = simpo.pair_losses(logps, lengths, torch.full((4,), float("nan"), dtype=torch.float64))
    d = (-10 / 4 - -12 / 6) - 0.5 / 2.0
    assert losses[0].item() == pytest.approx(-math.log(1 / (1 + math.exp(-2.0 * d))), rel=1e-6)
    assert PreferenceLoss.count(torch.zeros(6, 9)).item() == 3


def test_a_frozen_copy_swaps_the_initial_weights_in_and_back_out():
    from torch import nn

    from trainer.loop.reference import FrozenReference

    class Engine:  # what FrozenReference reads of an engine: its modules and their parameters
        def __init__(self, module: nn.Module):
            self.model_parts = [module]

        def parameters(self):
            return self.model_parts[0].parameters()

    torch.manual_seed(0)
    module = nn.Linear(4, 3)
    initial = [p.detach().clone() for p in module.parameters()]
    held = FrozenReference(engine=Engine(module), lora=False)
    held.take()
    assert held.nbytes == sum(p.numel() * p.element_size() for p in module.parameters())
    with torch.no_grad():  # training moves the policy
        for p in module.parameters():
            p.add_(1.0)
    trained = [p.detach().clone() for p in module.parameters()]
    with held.active():
        assert all(torch.equal(p, w) for p, w in zip(module.parameters(), initial))
    assert all(torch.equal(p, w) for p, w in zip(module.parameters(), trained))  # back, bit for bit
    assert all(torch.equal(w, i) for w, i in zip(held.weights, initial))


def test_the_reference_key_is_checked_before_spawn(compose_cfg):
    from trainer.checks.findings import Findings
    from trainer.checks.run import check_trainer

    found = Findings()
    check_trainer(compose_cfg("trainer.preference.reference=frozen"), None, found)
    assert found.problems == ["trainer.preference.reference=frozen: use one of pass, copy"]
