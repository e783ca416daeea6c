"""The anchor of the preference objectives: meshtrain's DPO loss and rewards on a tiny Qwen3 equal TRL's DPOTrainer's
on the same pairs (TRL as a test dependency, no TRL code copied). In process, but a system test by nature: it builds
TRL's whole trainer (importing trl and datasets: 1.0-1.3 s of the fast tier's quiet runs, 2 s under load), so it runs in
``make test``, moved from tests/unit/test_preference.py with its assertions unchanged; data=preference and the
objectives' formulas stay there."""

from __future__ import annotations

import pytest
import torch

from models.objectives import PreferenceObjective
from models.preference import PreferenceLoss, mean_stats, reference_column, sequence_logps
from tests.chat_helpers import PREFERENCE_SEQ, VOCAB, preference_data, preference_pairs, write_tokenizer


@pytest.fixture
def tokenizer(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


def test_dpo_loss_and_rewards_equal_trls_dpo_trainer(tokenizer, tmp_path):
    """The same pairs, policy and reference: TRL's DPOTrainer (fp32, its own tokenization, its reference forward)
    and meshtrain's data=preference rows through the meshtrain twins of the two models and PreferenceLoss."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from tests.hf_helpers import hf_model, meshtrain_twin

    shape = {"vocab_size": VOCAB, "max_position_embeddings": 128, "num_key_value_heads": 2, "head_dim": 32}
    policy, ref = hf_model("qwen3", seed=0, **shape), hf_model("qwen3", seed=1, **shape)
    with torch.no_grad():  # a peaked reference: log-ratios of nats, not hundredths (rewards far from rounding)
        ref.lm_head.weight.mul_(8.0)
    rows = preference_pairs(4, seed=3)
    data = preference_data(rows, tokenizer, tmp_path, global_batch_size=8)
    data.prepare()
    x, y = data.global_batch(0)
    twin_policy, twin_ref = (meshtrain_twin("qwen3", m, max_seq_len=PREFERENCE_SEQ)[0] for m in (policy, ref))
    loss_fn = PreferenceLoss(PreferenceObjective(name="dpo", beta=0.1))
    with torch.no_grad():
        y[:, -1] = reference_column(sequence_logps(twin_ref(x), y[:, :-1])[0])
        ours = float(loss_fn(twin_policy(x), y)) / 4  # the sum over the batch's 4 pairs
    means = mean_stats(loss_fn.take(torch.device("cpu")))

    tok = AutoTokenizer.from_pretrained(tokenizer)
    args = DPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", beta=0.1, use_cpu=True, bf16=False,
                     max_length=None, per_device_train_batch_size=4)  # fmt: skip
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tok)  # fmt: skip
    # meshtrain's batch holds the 4 pairs in a seeded order, TRL's in file order: the means are over the same pairs
    collated = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        theirs = float(trainer.compute_loss(policy, collated))
    metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    print(f"DPO loss: meshtrain {ours:.8f}, TRL {theirs:.8f}; rewards chosen {means['rewards_chosen']:.8f} / "
          f"{metrics['rewards/chosen']:.8f}, rejected {means['rewards_rejected']:.8f} / "
          f"{metrics['rewards/rejected']:.8f}")  # fmt: skip
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert means["rewards_chosen"] == pytest.approx(metrics["rewards/chosen"], rel=1e-5)
    assert means["rewards_rejected"] == pytest.approx(metrics["rewards/rejected"], rel=1e-5)
    assert means["rewards_accuracy"] == pytest.approx(metrics["rewards/accuracies"])
    assert means["logps_chosen"] == pytest.approx(metrics["logps/chosen"], rel=1e-6)
