"""The commands README.md prints, and the docs/ command blocks marked runnable, read back as a user copies them.

What counts as a command:
- README.md: every line of a fenced ``bash`` (``sh``, ``shell``) block, and each backticked command in the first
  column of the "## Commands" table;
- docs/*.md: the lines of a fenced block whose info string carries the word ``runnable`` (```` ```bash runnable ````;
  GitHub renders it as bash);
- a line ending in ``\\`` continues on the next; ``# ...`` comments are dropped (shlex's rules, so a ``#`` inside
  quotes stays); a command is keyed by its words (shlex's) joined by single spaces, quotes gone.

Each command has one entry in ``PLANS`` (tests/unit/test_readme_command_plans.py fails on a command without one and on
an entry no page prints any more):
- ``Run(scenario, ...)``: tests/integration/test_readme_commands.py runs it in each scenario, shortened by ``SHORT``;
- ``Compose()``: composed and validated in one process (tests/unit/test_readme_command_plans.py), nothing trained;
- ``Covered(test)``: another test runs it (the unit test checks that test exists);
- ``Skip(reason)``: not run by the suite (GPU only, a benchmark, the suite itself ...), with the reason.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = ("bash", "sh", "shell")
#: the word in a docs/ block's info string that makes its commands part of the README test
RUNNABLE = "runnable"
#: what a train.py run gets appended: 2 steps (an evaluation at step 2 when the command asks for one), no W&B
#: (tests/integration/test_readme_commands.py::test_default_job_outputs and test_wandb_run_across_resumes.py read W&B
#: runs back)
SHORT = ("trainer.max_steps=2", "logger=none")
SHORT_EVAL = "trainer.eval_every=2"


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it is, its info string and its text."""

    page: str
    line: int
    info: str
    text: str

    @property
    def lang(self) -> str:
        return (self.info.split() or [""])[0]

    def commands(self) -> list[list[str]]:
        return logical_commands(self.text)


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown page (indented ones included), in order."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    blocks = []
    for m in re.finditer(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", text, flags=re.S | re.M):
        indent = len(m.group(1))
        body = "\n".join(line[indent:] for line in m.group(3).splitlines())
        blocks.append(Block(page=page, line=text[: m.start()].count("\n") + 1, info=m.group(2).strip(), text=body))
    return blocks


def logical_commands(text: str) -> list[list[str]]:
    """The commands of a shell block as shlex's words: continued lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            out.append(words)
    return out


def readme_blocks() -> list[Block]:
    return [b for b in fenced_blocks(ROOT / "README.md") if b.lang in SHELL]


def docs_blocks() -> list[Block]:
    """docs/ blocks marked runnable."""
    return [
        b
        for page in sorted((ROOT / "docs").glob("*.md"))
        for b in fenced_blocks(page)
        if RUNNABLE in b.info.split()[1:]
    ]


def table_commands() -> list[list[str]]:
    """The backticked commands in the first column of README's "## Commands" table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split(" | ", 1)[0]
        for span in re.findall(r"`([^`]+)`", first):
            if re.match(r"(python|meshtrain|torchrun|wandb|make|pytest|pip)\b", span):
                found.append(shlex.split(span))
    return found


def printed() -> list[tuple[str, list[str]]]:
    """(where, words) of every command, in page order (``page:line``; ``README.md:table`` for the table): fresh lists
    of the pages as they were first read in this process."""
    return [(place, list(words)) for place, words in _printed()]


@functools.cache
def _printed() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``printed``, the pages read and split once per process (20 ms a time: a test looks up many commands)."""
    found = [(f"{b.page}:{b.line}", words) for b in readme_blocks() + docs_blocks() for words in b.commands()]
    return tuple((place, tuple(words)) for place, words in found + [("README.md:table", w) for w in table_commands()])


def all_commands() -> dict[str, list[str]]:
    """command (its words joined by a space) -> where it is printed."""
    where: dict[str, list[str]] = {}
    for place, words in printed():
        where.setdefault(" ".join(words), []).append(place)
    return where


def printed_words(command: str) -> list[str]:
    """The words of ``command`` as a page prints them (quotes resolved as a shell does)."""
    return next(words for _, words in printed() if " ".join(words) == command)


def python_blocks(page: str = "README.md") -> list[Block]:
    return [b for b in fenced_blocks(ROOT / page) if b.lang == "python"]


def expected_output(block: Block) -> str:
    """The text a python block says it prints: its last line, a ``# `` comment after a ``print``."""
    last = block.text.rstrip().splitlines()[-1]
    assert last.startswith("# "), f"{block.page}:{block.line}: the block does not end with the line it prints"
    return last[2:]


# ---- what the suite does with each command --------------------------------------------------------------


@dataclass(frozen=True, init=False)
class Run:
    """Run by tests/integration/test_readme_commands.py in each of ``scenarios`` (a command two sections print)."""

    scenarios: tuple[str, ...]

    def __init__(self, *scenarios: str):
        object.__setattr__(self, "scenarios", scenarios)


@dataclass(frozen=True)
class Compose:
    pass


@dataclass(frozen=True)
class Covered:
    test: str
    """``tests/....py::test_name``"""


@dataclass(frozen=True)
class Skip:
    reason: str


SUITE = Skip("the test suite or lint itself (CI runs them: .ci/run)")
BENCHMARK = Skip("a benchmark: minutes of measurement, never run for numbers in the suite (docs/benchmarks.md)")
INTEGRATION = "tests/integration/"
SYSTEM = "tests/system/"
README_TEST = INTEGRATION + "test_readme_commands.py"

PLANS: dict[str, Run | Compose | Covered | Skip] = {
    # README: two commands
    "make train": Run("default_job"),
    "make test": SUITE,
    # README: your own data (and docs/data.md, step 1 and 2)
    "python -m trainer.data.prepare --input my_corpus/ --output data/my_corpus --vocab-size 4096": Run("own_data"),
    "python train.py data=tokens data.path=data/my_corpus model.vocab_size=4096 trainer.eval_every=50": Run("own_data"),
    # README: Hugging Face in and out
    "python -m trainer.data.prepare --input my_corpus/ --output data/my_corpus_qwen3 --tokenizer ~/models/Qwen3-0.6B": (
        Run("hugging_face")
    ),
    "python train.py model.init_from=~/models/Qwen3-0.6B data=tokens data.path=data/my_corpus_qwen3 parallel=fsdp": (
        Run("hugging_face")
    ),
    "python -m trainer.export outputs/<date>/<time> --hf exported/": Run("hugging_face", "default_export"),
    "python -m trainer.export outputs/<date>/<time> --hf exported/ --dtype bf16 --overwrite": Run("hugging_face"),
    # README: the default job's export (its first command is the default job itself, run once by `make train`)
    "python train.py": Run("default_job"),
    "python -m trainer.generate outputs/<date>/<time> --prompt def main( --max-new-tokens 40": Run("default_export"),
    "python train.py model.init_from=exported/": Run("default_export"),
    # README: the installed command
    "pip install .": Covered(INTEGRATION + "test_meshtrain_command.py::test_installed_package_carries_its_configs"),
    "cd ~/anywhere": Covered(INTEGRATION + "test_meshtrain_command.py::test_meshtrain_composes_from_any_folder"),
    "meshtrain parallel=hybrid pp.micro_batches=8": Compose(),
    "meshtrain --config-dir ~/my_conf experiment=my_exp": Covered(
        INTEGRATION + "test_meshtrain_command.py::test_meshtrain_trains_a_user_model_and_experiment"
    ),
    # README: tests
    "make test-unit": SUITE,
    "make lint": SUITE,
    "pytest tests/unit": SUITE,
    "pytest tests/system": SUITE,
    "pytest tests/integration": SUITE,
    # README: the commands table
    "python train.py parallel=NAME": Covered("tests/unit/test_config_groups.py::test_parallel_option_instantiates"),
    "python train.py parallel=pp pp.micro_batches=8 pp.schedule=1f1b": Compose(),
    "python train.py model.init_from=DIR data=preference data.path=pairs.jsonl trainer.objective=dpo model.lora.rank=8 parallel=fsdp": Covered(
        INTEGRATION + "test_preference_layouts.py::test_step_one_is_ln2_and_the_held_out_pairs_are_scored"
    ),
    "python train.py parallel=hybrid pp.micro_batches=8": Compose(),
    "python train.py parallel=hybrid dp.size=1 tp.size=1 pp.size=1 cp.size=2 model=llama_debug data.seq_len=1024": Compose(),
    "python train.py -m trainer.seed=1,2": Covered(
        INTEGRATION + "test_launch_paths.py::test_multirun_two_jobs_isolated"
    ),
    "python train.py -m parallel=pp pp.micro_batches=2,4,8 pp.split_points=[1],[2],[3]": Covered(
        INTEGRATION
        + "test_sweep_multiruns.py::test_invalid_combinations_are_skipped_with_their_reason_and_the_others_run"
    ),
    "python -m trainer.report multirun/<date>/<time> [--wandb-workspace]": Covered(
        INTEGRATION + "test_sweep_multiruns.py::test_grid_sweep_report_has_one_row_per_job_with_the_summaries_values"
    ),
    "python train.py hparams_search=pp_throughput": Covered(
        INTEGRATION + "test_sweep_multiruns.py::test_optuna_search_runs_three_trials_and_copes_with_a_skipped_one"
    ),
    "python -m trainer.data.prepare --input DIR --output OUT --vocab-size 4096": Run("own_data"),
    "python train.py model=llama3_2_1b model.init_from=HF_DIR parallel=...": Covered(
        INTEGRATION + "test_hf_init_from_and_export.py::test_fine_tune_under_every_layout_matches_single"
    ),
    "python -m trainer.export RUN_OR_CHECKPOINT --hf OUT": Covered(README_TEST + "::test_hugging_face_in_and_out"),
    "python train.py model.init_from=HF_DIR data=chat data.path=chats.jsonl data.packing=documents": Covered(
        INTEGRATION + "test_chat_finetune.py::test_step_one_is_transformers_loss_on_the_packed_rows"
    ),
    "python train.py model.init_from=HF_DIR data=chat data.path=chats.jsonl model.lora.rank=16": Covered(
        INTEGRATION + "test_chat_finetune.py::test_lora_trains_the_adapters_only_and_exports_a_peft_folder"
    ),
    "meshtrain export ...": Covered("tests/system/test_hf_export.py::test_meshtrain_export_is_the_exporter"),
    # the README's second own-data command with OUT named: it runs there
    "python train.py data=tokens data.path=OUT model.vocab_size=4096 trainer.eval_every=50": Covered(
        README_TEST + "::test_your_own_data"
    ),
    "python train.py -m hparams_search=val_loss": Covered(
        INTEGRATION
        + "test_sweep_multiruns.py"
        + "::test_validation_loss_search_completes_its_trials_and_one_without_evaluation_ends_with_exit_2"
    ),
    "python -m trainer.report DIR --rank-by val_loss": Covered(
        INTEGRATION
        + "test_sweep_multiruns.py"
        + "::test_validation_loss_search_completes_its_trials_and_one_without_evaluation_ends_with_exit_2"
    ),
    "python train.py experiment=ddp_baseline": Compose(),
    "python train.py -m hydra/launcher=slurm ...": Covered(
        INTEGRATION
        + "test_slurm_requeue_and_sweeps.py::test_slurm_jobs_with_two_tasks_each_train_the_local_runs_losses"
    ),
    "torchrun --nproc_per_node=2 train.py": Covered(
        INTEGRATION + "test_launch_paths.py::test_torchrun_gives_one_output_folder"
    ),
    "python train.py topology=multi_node topology.node_rank=K topology.master_addr=HOST ...": Covered(
        INTEGRATION + "test_launch_paths.py::test_two_nodes_on_localhost_join_one_rendezvous"
    ),
    "python train.py --help": Covered(
        "tests/integration/test_command_line_processes.py::test_help_is_meshtrains_own_and_fits_one_screen"
    ),
    "python train.py --cfg job [--resolve]": Compose(),
    "python train.py logger=tensorboard": Covered(
        INTEGRATION + "test_tensorboard_logger.py::test_tensorboard_event_files_hold_the_runs_losses"
    ),
    "python train.py trainer.callbacks=[{_target_:my.module.MyCallback}]": Covered(
        INTEGRATION + "test_trainer_callbacks.py::test_user_callback_sees_every_step_validation_and_checkpoint"
    ),
    "wandb leet outputs/<date>/<time>/wandb": Covered(
        INTEGRATION + "test_readme_commands.py::test_default_job_outputs"
    ),
    "meshtrain ...": Covered(
        INTEGRATION + "test_meshtrain_command.py::test_meshtrain_trains_a_user_model_and_experiment"
    ),
    "python train.py parallel=auto": Covered(
        INTEGRATION + "test_auto_trains_its_first_choice.py::test_auto_plans_prints_and_trains_first_choice"
    ),
    "python -m parallel.plan model=gpt_175b topology=cluster_1024xh100 [--top 10] [--json]": Covered(
        "tests/unit/test_planner_search_and_cli.py::test_plan_json_contract"
    ),
    "python -m parallel.plan model=gpt_175b topology=cluster_1024xh100 --dry-run": Covered(
        INTEGRATION + "test_dry_run_vs_real_run.py::test_plan_cli_dry_run_of_a_gpu_plan"
    ),
    "python -m parallel.plan model=llama3_8b topology=cluster_1024xh100 data.seq_len=131072 --dry-run": Covered(
        SYSTEM + "test_planner_full_size.py::test_the_planner_picks_cp_at_128k_and_says_why"
    ),
    "python -m parallel.plan model=qwen3_235b_a22b topology=cluster_1024xh100 --dry-run": Covered(
        SYSTEM + "test_planner_full_size.py::test_qwen3_235b_on_1024_h100s_ranks_expert_parallel_first"
    ),
    "python train.py parallel=hybrid trainer.dry_run=true": Covered(
        INTEGRATION + "test_dry_run_vs_real_run.py::test_dry_run_bytes_equal_a_real_run_of_the_same_layout"
    ),
    "python benchmarks/overhead.py": BENCHMARK,
    "python benchmarks/pipeline.py": BENCHMARK,
    "python train.py trainer.precision=bf16-mixed trainer.activation_checkpointing=selective trainer.compile=true": Compose(),
    "python benchmarks/gpu_smoke.py": Covered(INTEGRATION + "test_gpu_smoke_script.py::test_gpu_smoke_tiny_on_cpu"),
    "python benchmarks/precision.py": BENCHMARK,
    "python benchmarks/muon_step.py": BENCHMARK,
    "python benchmarks/muon_vs_adamw.py": BENCHMARK,
    "python benchmarks/hf_backend.py": BENCHMARK,
    "python benchmarks/vs_torchtitan.py": BENCHMARK,
    "python train.py model=llama_debug optim=muon parallel=fsdp": Covered(
        INTEGRATION + "test_muon_layouts.py::test_real_gradients_give_singles_losses_norms_and_parameters"
    ),
    # docs/callbacks.md, docs/parallelism.md, docs/pipeline.md (blocks marked runnable)
    "python train.py trainer.callbacks=[{_target_:my_callbacks.PrintLoss,every:10}]": Covered(
        INTEGRATION + "test_trainer_callbacks.py::test_user_callback_sees_every_step_validation_and_checkpoint"
    ),
    "python train.py parallel=tp": Compose(),
    "python train.py parallel=tp tp.sequence_parallel=true tp.loss_parallel=true": Compose(),
    "python train.py parallel=fsdp": Compose(),
    "python train.py parallel=hybrid dp.size=2 tp.size=1 pp.size=2 dp.shard=true": Compose(),
    "python train.py parallel=hybrid --cfg job --resolve": Compose(),
    "python train.py model=qwen3_moe_debug parallel=hybrid dp.size=2 ep.size=2 tp.size=1 pp.size=1": Compose(),
    "python train.py model=qwen3_moe_debug parallel=hybrid dp.size=2 ep.size=2 tp.size=1 pp.micro_batches=2": Compose(),
    "python train.py model=qwen3_moe_debug parallel=hybrid dp.size=2 ep.size=2 tp.size=2 pp.size=1": Compose(),
    "python train.py parallel=mp": Compose(),
    "python train.py parallel=mp mp.split_points=[3]": Compose(),
    "python train.py parallel=pp pp.micro_batches=8": Compose(),
    "python train.py parallel=pp pp.schedule=gpipe pp.micro_batches=4 pp.split_points=[2]": Compose(),
    "python train.py parallel=pp pp.schedule=interleaved_1f1b pp.stages_per_rank=2 pp.micro_batches=4": Compose(),
    "python train.py parallel=pp pp.schedule=zero_bubble pp.micro_batches=4": Compose(),
    "python train.py parallel=pp pp.split=balanced": Compose(),
    "python train.py -m parallel=pp pp.micro_batches=1,2,4,8 pp.split_points=[1],[2],[3]": Covered(
        INTEGRATION
        + "test_sweep_multiruns.py::test_invalid_combinations_are_skipped_with_their_reason_and_the_others_run"
    ),
}
