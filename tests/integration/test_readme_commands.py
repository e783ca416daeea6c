"""The README's commands run as printed (tests/readme_commands.py: what is extracted, and the plan of each).

Each test is one scenario: the ``Run`` commands of that scenario, in the order the pages print them, in a fresh
folder that holds what the README assumes is there. The rules that turn a printed command into a short run:
- ``python train.py ARGS`` runs as ``python train.py ARGS trainer.max_steps=2 logger=none`` (and
  ``trainer.eval_every=2`` when ARGS ask for evaluations) through ``run_train`` (a fork of the warm runner, the
  same train.py), into ``outputs/runN`` of the folder; ``make train`` / ``python train.py`` alone is the session's
  ``default_job`` (``make train`` as printed, 200 steps, whose outputs test_default_job_outputs reads back);
- ``python -m MODULE ARGS`` calls ``MODULE.main(ARGS)`` in this process, in the folder (the same argument parsing);
- ``outputs/<date>/<time>`` is the folder of the scenario's last train.py run; ``HOME`` is the scenario's folder
  (``~/models/Qwen3-0.6B`` holds the default job's export: a Hugging Face folder with its tokenizer, no download), and
  a command with a ``~`` runs as bash runs it: a word that starts with ``~`` expanded, ``key=~/...`` passed as
  written (a ``python train.py`` run then starts in a new interpreter whose ``HOME`` is the folder);
  ``my_corpus/`` holds text, jsonl and parquet files (tests/helpers.py ``write_corpus``);
- a python block runs in the folder; its last line (a ``# `` comment) is an example of what it prints, from one
  machine: what the test asserts holds on any CPU (the same greedy tokens in meshtrain and transformers, up to a
  near-tie; losses below a bound), never one machine's rounding.
Every test checks that it ran exactly its scenario's commands, so a command added to a scenario runs.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import TrainRun, run_train, write_corpus
from tests.readme_commands import PLANS, SHORT, SHORT_EVAL, Run, expected_output, printed, python_blocks
from trainer.observe.wandb_read import read_run

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def inside(folder: Path):
    """The working folder changed for a while (contextlib.chdir is Python 3.11+; meshtrain runs on 3.10)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def home(folder: Path):
    """``HOME`` pointed at ``folder`` for a while, as a user whose home holds what the README assumes."""
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = before


class Scenario:
    """One scenario's folder and the commands it ran."""

    def __init__(self, name: str, folder: Path, *, default_job: TrainRun | None = None, names=None):
        self.name, self.folder = name, folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.last_run = default_job.run_dir if default_job is not None else None
        self.default_job = default_job
        self.names = dict(names or {})  # placeholder -> what it stands for here
        self.ran: list[str] = []
        self.runs: list[TrainRun] = []

    def commands(self) -> list[list[str]]:
        """This scenario's commands, in page order, each once."""
        seen, out = set(), []
        for _, words in printed():
            key = " ".join(words)
            plan = PLANS.get(key)
            if isinstance(plan, Run) and self.name in plan.scenarios and key not in seen:
                seen.add(key)
                out.append(words)
        return out

    def substitute(self, word: str) -> str:
        if self.last_run is not None:
            word = word.replace("outputs/<date>/<time>", str(self.last_run))
        word = self.names.get(word, word)
        with home(self.folder):  # bash expands a word that starts with ~, not the ~ of key=~/...
            return os.path.expanduser(word) if word.startswith("~") else word

    def run(self, words: list[str]) -> str:
        """Run one printed command; returns its output."""
        self.ran.append(" ".join(words))
        if words in (["make", "train"], ["python", "train.py"]):
            assert self.default_job is not None, "the default job belongs to the default_job scenario"
            return self.default_job.output
        args = [self.substitute(w) for w in words]
        if args[:2] == ["python", "train.py"]:
            short = [*SHORT, *([SHORT_EVAL] if any(a.startswith("trainer.eval_every=") for a in args) else [])]
            run_dir = self.folder / "outputs" / f"run{len(self.runs)}"
            env = {"HOME": str(self.folder)} if any("~" in a for a in args) else None
            run = run_train(*args[2:], *short, run_dir=run_dir, cwd=self.folder, env=env)
            self.runs.append(run)
            self.last_run = run_dir
            return run.output
        assert args[:2] == ["python", "-m"], f"no rule runs {words}"
        out = io.StringIO()
        with inside(self.folder), home(self.folder), contextlib.redirect_stdout(out):
            code = importlib.import_module(args[2]).main(args[3:])
        assert code == 0, f"{' '.join(words)} exited {code}:\n{out.getvalue()[-3000:]}"
        return out.getvalue()

    def run_all(self) -> dict[str, str]:
        """Every command of the scenario; command -> output."""
        return {" ".join(words): self.run(words) for words in self.commands()}


def default_export(default_job: TrainRun, folder: Path) -> Path:
    """The default job's export, where a scenario needs a Hugging Face folder."""
    from trainer.export import export

    return export(default_job.run_dir, folder, log=lambda *a: None)


def test_default_job(default_job):
    """``make train`` (and ``python train.py``): what the README says of it, read from the run."""
    scenario = Scenario("default_job", default_job.run_dir.parent / "readme", default_job=default_job)
    outputs = scenario.run_all()
    assert set(scenario.ran) == {"make train", "python train.py"}
    summary = default_job.summary()
    assert summary["steps"] == 200 and summary["layout"]["strategy"] == "ddp" and summary["layout"]["world_size"] == 2
    # "the loss falls from 5.5 to about 2.6": from about ln(256) (uniform over the bytes) to below a bound that holds
    # on any CPU (2.65 at step 200 here, 2.64 on an AMD EPYC), not one machine's rounding
    assert summary["first_loss"] == pytest.approx(5.5, abs=0.1)
    assert summary["final_loss"] < 3.0
    assert all(f"outputs in {default_job.run_dir}" in out for out in outputs.values())


#: how far apart two next tokens' log-probabilities may be for meshtrain and transformers to pick differently: the two
#: implementations agree to ~1e-6 in fp32 logits (README, "Hugging Face in and out"), so only a near-tie can flip
NEAR_TIE = 1e-4


def transformers_greedy(export: Path, prompt: str, max_new_tokens: int) -> tuple[list[int], Any, Any]:
    """transformers' greedy continuation of ``prompt`` on the export (what its pipeline prints), as token ids; the
    model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0].tolist(), model, tokenizer


def meshtrain_greedy(run_dir: Path, prompt: str, max_new_tokens: int) -> tuple[list[int], str]:
    """meshtrain's own greedy decoding of the run's checkpoint (trainer.generate's steps), as token ids; the text
    trainer.generate prints for them."""
    from trainer.export import find_checkpoint
    from trainer.generate import greedy, load_model, run_tokenizer

    checkpoint = find_checkpoint(run_dir)
    model, model_cfg = load_model(checkpoint)
    tokenizer, eos = run_tokenizer(checkpoint, model_cfg)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    out = greedy(model, ids, max_new_tokens=max_new_tokens, context=int(model_cfg["max_seq_len"]), eos=eos)
    return out, prompt + tokenizer.decode([i for i in out[len(ids) :] if i != eos], skip_special_tokens=True)


def assert_same_greedy_tokens(mine: list[int], theirs: list[int], hf_model: Any) -> None:
    """The two greedy decodings pick the same tokens, or part where transformers' own log-probabilities of the two
    picks are within NEAR_TIE (another CPU's fp32 rounding may break a tie either way; nothing after it compares)."""
    import torch

    for k, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            with torch.no_grad():
                logp = torch.log_softmax(hf_model(torch.tensor([theirs[:k]])).logits[0, -1].double(), dim=-1)
            gap = abs(float(logp[a] - logp[b]))
            assert gap < NEAR_TIE, f"token {k}: meshtrain picks {a}, transformers {b}, log-probs {gap:.3g} apart"
            return
    assert len(mine) == len(theirs), (mine, theirs)


def test_default_job_outputs(default_job):
    """The default job end to end (here, beside the README's scenarios, so that one pytest-xdist worker runs the
    session's ``default_job`` once for both): every output file, read back, and the W&B offline run's contents."""
    run = default_job  # `make train` as printed: 200 steps (tests/conftest.py; the README test exports it)
    d = run.run_dir
    # console: progress lines and where the outputs are
    assert "done: loss" in run.proc.stdout and f"outputs in {d}" in run.proc.stdout
    # before step 1 it says what it does, on the clock of the command's start (issue 42)
    before = run.proc.stdout[: run.proc.stdout.index("step     1 |")]
    for stage in ("checking the run", "preparing the data", "starting 2 worker(s)", "building the model"):
        assert f" s] {stage}" in before, before[-3000:]

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, *range(10, 201, 10)]
    for m in metrics:
        assert {"step", "loss", "lr", "step_time_s", "tokens_per_s", "comm_fraction"} <= m.keys()
        assert m["tokens_per_s"] == pytest.approx(16 * 128 / m["step_time_s"], rel=1e-6)
        assert 0 < m["step_cpu_s"] < 10 * m["step_time_s"]  # the process's CPU time in the step, all threads
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"], "loss did not fall by 30%"

    summary = run.summary()
    assert summary["time_to_first_step_s"] > summary["fit_to_first_step_s"] > 0  # from the command's start
    assert summary["final_loss"] == pytest.approx(metrics[-1]["loss"])
    assert summary["first_loss"] == pytest.approx(metrics[0]["loss"])
    assert summary["tokens_per_s"] > 0 and len(summary["peak_memory_bytes_per_rank"]) == 2
    cpu = summary["median_step_cpu_s_per_rank"]
    assert len(cpu) == 2 and all(0 < c < 10 * summary["median_step_time_s"] for c in cpu)
    layout = summary["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"], layout["world_size"]) == (2, 1, 1, 2)
    assert [r["rank"] for r in layout["rank_map"]] == [0, 1]

    assert (d / "logs" / "rank0.log").read_text().count("step ") >= 5
    assert "rank 1/2" in (d / "logs" / "rank1.log").read_text()
    hydra_cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
    assert hydra_cfg["parallel"]["name"] == "ddp" and hydra_cfg["trainer"]["max_steps"] == 200

    # W&B offline run: history rows are the logged steps, config is the resolved Hydra config
    wb = read_run(d)
    rows = [r for r in wb.history if "train/loss" in r]
    assert [r["train/step"] for r in rows] == [r["_step"] for r in rows] == [1, *range(10, 201, 10)]
    assert [r["train/loss"] for r in rows] == pytest.approx([m["loss"] for m in metrics])
    assert wb.config["parallel"]["name"] == "ddp"
    assert wb.config["model"]["max_seq_len"] == 128  # interpolation resolved
    assert wb.config["trainer"]["max_steps"] == 200
    assert wb.job_type == "ddp" and "dp2" in wb.tags
    assert wb.summary["final_loss"] == pytest.approx(summary["final_loss"])
    assert json.loads((d / "summary.json").read_text())["wandb_dir"]


def test_default_export_continues_a_prompt_and_starts_a_run(default_job, tmp_path):
    """The default job exported; meshtrain's greedy decoding picks transformers' tokens on the export (the README's
    snippet and trainer.generate print them; the README's line is one machine's example, not asserted); the export
    starts a new run by itself."""
    scenario = Scenario("default_export", tmp_path, default_job=default_job)
    outputs = {}
    for words in scenario.commands():
        key = " ".join(words)
        outputs[key] = scenario.run(words)
        if key == "python train.py model.init_from=exported/":  # the export's family and sizes, alone
            assert "model.init_from=" in outputs[key] and scenario.runs[-1].summary()["steps"] == 2
            scenario.last_run = default_job.run_dir
    [snippet] = python_blocks()
    assert ast.literal_eval(expected_output(snippet)).startswith("def main(")  # what the README shows: an example
    out = io.StringIO()
    with inside(tmp_path), contextlib.redirect_stdout(out):
        exec(compile(snippet.text, f"README.md:{snippet.line}", "exec"), {"__name__": "__main__"})
    prompt, new = "def main(", 40
    theirs, hf_model, hf_tokenizer = transformers_greedy(tmp_path / "exported", prompt, new)
    mine, mine_text = meshtrain_greedy(default_job.run_dir, prompt, new)
    assert_same_greedy_tokens(mine, theirs, hf_model)
    n = len(hf_tokenizer(prompt, add_special_tokens=False).input_ids)
    # the snippet prints transformers' continuation, trainer.generate meshtrain's
    assert ast.literal_eval(out.getvalue().strip()) == prompt + hf_tokenizer.decode(
        theirs[n:], skip_special_tokens=True
    )
    generated = next(v for k, v in outputs.items() if k.startswith("python -m trainer.generate"))
    assert generated == mine_text + "\n"
    assert len(scenario.ran) == 3


def test_your_own_data(tmp_path):
    """Prepare a folder of files, prepare again (a no-op), train on it with evaluations."""
    write_corpus(tmp_path / "my_corpus", words=600)  # the one held-out document holds a window of 129 tokens
    scenario = Scenario("own_data", tmp_path, names={"DIR": "my_corpus/", "OUT": "data/my_corpus"})
    outputs = scenario.run_all()
    assert len(outputs) == 3  # the README's two commands and the table's prepare, which finds it done
    assert "is up to date" in outputs["python -m trainer.data.prepare --input DIR --output OUT --vocab-size 4096"]
    meta = json.loads((tmp_path / "data" / "my_corpus" / "metadata.json").read_text())
    assert meta["splits"]["validation"]["tokens"] > 0 and meta["tokenizer"]["vocab_size"] <= 4096
    summary = scenario.runs[-1].summary()
    assert summary["steps"] == 2 and summary["val_loss"] > 0 and summary["val_ppl"] > 1


def test_hugging_face_in_and_out(default_job, tmp_path):
    """From a Hugging Face folder (the default job's export at ~/models/Qwen3-0.6B): prepare with its tokenizer
    (no --eos-token), fine-tune under fsdp from it alone, export, export again in bf16 over it."""
    write_corpus(tmp_path / "my_corpus")
    default_export(default_job, tmp_path / "models" / "Qwen3-0.6B")
    scenario = Scenario("hugging_face", tmp_path)
    outputs = scenario.run_all()
    assert len(outputs) == 4
    meta = json.loads((tmp_path / "data" / "my_corpus_qwen3" / "metadata.json").read_text())
    assert meta["tokenizer"]["eos_id"] == 0  # the export's end-of-text (NUL in the byte vocabulary)
    summary = scenario.runs[-1].summary()
    assert summary["layout"]["strategy"] == "fsdp" and summary["steps"] == 2
    header = (tmp_path / "exported" / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", header[:8])[0]
    dtypes = {v["dtype"] for k, v in json.loads(header[8 : 8 + size]).items() if k != "__metadata__"}
    assert dtypes == {"BF16"}  # the second export replaced the first
    assert not list((tmp_path / "exported").glob("*.safetensors.index.json"))
    shutil.rmtree(tmp_path / "models")
