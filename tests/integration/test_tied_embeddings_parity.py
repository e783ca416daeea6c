"""A tied Llama (``llama3_2_1b``'s layout at a tiny size: grouped-query attention, the output projection sharing the
token embedding's weight) trains under tp, pp and hybrids with parallel=single's losses, gradient norms and final
parameters; the pipeline's two copies of the tied weight are equal after every run; a hybrid checkpoint exports to
transformers with meshtrain's logits; single's checkpoint resumes under pp.

One multirun starts every layout, each exercising one way the tie is kept:
- tp 2 (loss parallel): one Parameter, vocabulary-sharded like its head;
- pp 2, 1F1B: a copy on each rank, gradients summed over the pp group;
- pp 2, ZBV (V-shaped): the first and the last stage on one rank, one Parameter;
- pp 4, 1F1B: the copies on pp ranks 0 and 3 only (an embedding group per pp line; ranks 1-2 hold none);
- dp 2 x tp 2 x pp 2, sequence parallel: FSDP2 over TP shards of each copy;
- dp 2 x pp 2, ZBV: FSDP2 over the first and the last stage on one rank, two local copies summed locally.
In-process pieces are in tests/unit/test_tied_embeddings.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAST, TrainRun, assert_losses_close, assert_parity, case_multirun, final_state, run_train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = (
    "model=llama_debug",
    "model.tie_embeddings=true",
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.d_ff=192",
)
#: 3 steps; every run's final parameters from the checkpoint its last step writes, single's step-1 one too (the
#: resume under pp starts there and runs 2 steps: the second one on the optimizer state it read)
STEPS = ("trainer.max_steps=3", "pp.trace_step=0")
HYBRID = {"defaults": [{"override /parallel": "hybrid"}]}


def pp(schedule: str, *, size: int = 2, v: int = 1, m: int = 4) -> dict:
    return {"size": size, "schedule": schedule, "micro_batches": m, "stages_per_rank": v}


CASES: dict[str, dict] = {
    "single": {
        "defaults": [{"override /parallel": "single"}],
        "trainer": {"checkpoint_every": 1, "keep_checkpoints": 3},
    },
    "tp2": {"defaults": [{"override /parallel": "tp"}], "tp": {"loss_parallel": True}},
    "pp2_1f1b": {"defaults": [{"override /parallel": "pp"}], "pp": pp("1f1b")},
    "pp2_zbv": {"defaults": [{"override /parallel": "pp"}], "pp": pp("zbv", v=2)},
    "pp4_1f1b": {"defaults": [{"override /parallel": "pp"}], "pp": pp("1f1b", size=4)},
    "dp2_tp2_pp2_sp": {**HYBRID, "dp": {"size": 2}, "tp": {"size": 2, "sequence_parallel": True}, "pp": pp("1f1b")},
    "dp2_pp2_zbv": {**HYBRID, "dp": {"size": 2}, "tp": {"size": 1}, "pp": pp("zbv", v=2)},
}
#: (dp, tp, pp) each case runs under
LAYOUTS = {
    "tp2": (1, 2, 1),
    "pp2_1f1b": (1, 1, 2),
    "pp2_zbv": (1, 1, 2),
    "pp4_1f1b": (1, 1, 4),
    "dp2_tp2_pp2_sp": (2, 2, 2),
    "dp2_pp2_zbv": (2, 1, 2),
}
#: the layouts with two copies of the tied weight (on two ranks, or on the two stages of one rank under FSDP2)
COPIES = ("pp2_1f1b", "pp4_1f1b", "dp2_tp2_pp2_sp", "dp2_pp2_zbv")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TrainRun]:
    jobs = case_multirun(CASES, *MODEL, *FAST, *STEPS, base=tmp_path_factory.mktemp("tied"), group="tied_case")
    return {case: TrainRun(proc=None, run_dir=job) for case, job in jobs.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_tied_model_matches_single(runs, case):
    layout = runs[case].summary()["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"]) == LAYOUTS[case]
    worst = assert_parity(runs[case], runs["single"])
    print(f"{case}: losses {runs[case].losses()}, max |param - single's| {worst:.2e}")


@pytest.mark.parametrize("case", COPIES)
def test_the_two_copies_are_equal_after_training(runs, case):
    """The first stage's rank wrote the embedding, the last stage's the head."""
    state = final_state(runs[case])
    emb, head = state["tok_embeddings.weight"], state["output.weight"]
    assert torch.equal(emb, head), f"{case}: copies differ by {(emb - head).abs().max().item():.3e}"


def test_single_checkpoint_resumes_under_pp(runs, tmp_path):
    """The head's copy on pp rank 1 reads its optimizer state from the embedding's name, where one process wrote
    the tied weight's."""
    step1 = runs["single"].run_dir / "checkpoints" / "step_0000001"
    run = run_train(
        "parallel=pp", "pp.micro_batches=4", *MODEL, *FAST, *STEPS, f"trainer.resume={step1}", run_dir=tmp_path / "r"
    )
    assert [m["step"] for m in run.metrics()] == [2, 3]
    assert_losses_close(run.losses(), runs["single"].losses()[1:], rel=1e-4)
    state = final_state(run)
    assert torch.equal(state["tok_embeddings.weight"], state["output.weight"])
    single = final_state(runs["single"])
    assert (state["output.weight"] - single["output.weight"]).abs().max().item() <= 1e-4


def test_hybrid_checkpoint_exports_to_transformers_with_equal_logits(runs, tmp_path):
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM

    from models.spec import builder_kwargs
    from tests.hf_helpers import max_logit_difference
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    out = export(runs["dp2_tp2_pp2_sp"].run_dir, tmp_path / "hf")
    checkpoint = find_checkpoint(runs["dp2_tp2_pp2_sp"].run_dir)
    module = instantiate(builder_kwargs(read_marker(checkpoint)["model"])).eval()
    module.load_state_dict(full_state(checkpoint))
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.config.tie_word_embeddings and hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), hf(tokens).logits)
    print(f"dp2_tp2_pp2_sp: exported after 3 steps, max |logit difference| in transformers {diff:.2e}")
    assert diff <= 1e-5
