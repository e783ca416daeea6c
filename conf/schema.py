"""Typed config schema of the whole job, registered in Hydra's ConfigStore.

Each layer types the keys it reads: the parallel layer's (parallel, dp, tp, pp, mp, topology, planner) in
``parallel/config.py``, each model family's in ``models/<family>/config.py``; this module adds the trainer's
groups (trainer, logger, data, optim) and the root, and registers them all. It lives beside the YAML it
types, below every package that composes a config (train.py, the planner CLI, the trainer).

Every key a user can set lives here with its type, so a misspelled key, a wrong type or an unknown
choice (enum-typed keys) fails at compose time, before anything starts. Groups whose options differ in
shape (model, data, optim) register one schema per shape under ``schema/<group>/`` (``schema/model/gpt``,
``schema/data/text`` ...), outside the groups users choose from, and each YAML option extends its schema
through its defaults list (``- /schema/model/gpt@_here_``), the pattern Hydra documents for extending a
config from another group. This module imports no torch: validation must stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from models.registry import model_schemas
from models.spec import import_object
from parallel.config import MPConfig, ParallelConfig, PlannerConfig, TopologyConfig
from parallel.foundation import dims
from parallel.foundation.checkpointing_modes import AC_MODES
from parallel.foundation.choices import choices
from parallel.foundation.optimizer import IMPLEMENTATIONS
from parallel.foundation.precision import FP8_RECIPES, PRECISIONS
from parallel.optim.muon_keys import ADJUST_LR_FNS, GATHER_WAYS

#: enum-typed choices of the trainer's keys: a typo fails at compose time (parallel/foundation/choices.py). Precision and
#: ActivationCheckpointing follow their one list: a new precision is one more name in PRECISIONS.
Precision = choices("Precision", PRECISIONS, module=__name__)
ActivationCheckpointing = choices("ActivationCheckpointing", AC_MODES, module=__name__)
OnNonFinite = choices("OnNonFinite", ("stop", "skip"), module=__name__)
WandbMode = choices("WandbMode", ("offline", "online", "disabled"), module=__name__)
WandbConsole = choices("WandbConsole", ("off", "wrap", "redirect", "auto"), module=__name__)
Decay = choices("Decay", ("cosine", "linear", "constant"), module=__name__)
OptimImplementation = choices("OptimImplementation", IMPLEMENTATIONS, module=__name__)
FP8Recipe = choices("FP8Recipe", FP8_RECIPES, module=__name__)
AdjustLrFn = choices("AdjustLrFn", ADJUST_LR_FNS, module=__name__)
MuonGather = choices("MuonGather", GATHER_WAYS, module=__name__)


@dataclass
class FP8Config:
    """``trainer.precision=fp8``: torchao's float8 training (parallel/techniques/fp8.py, docs/performance.md)."""

    recipe: FP8Recipe = FP8Recipe["tensorwise"]
    """tensorwise (one scale per tensor; FSDP2 may all-gather float8 weights) or rowwise (a scale per row,
    more accurate; communication in high precision)."""
    fsdp_float8_all_gather: Optional[bool] = None
    """FSDP2 all-gathers the float8 weights (half bf16's bytes); null: on for tensorwise under FSDP2."""
    skip: List[str] = field(default_factory=list)
    """FQN patterns (fnmatch) of Linears kept in bf16 besides the output head and a MoE router."""


@dataclass
class PreferenceConfig:
    """``trainer.objective=dpo`` or ``simpo`` on ``data=preference`` (models/preference.py)."""

    beta: float = 0.1
    """DPO: the strength of the implicit KL penalty (TRL's default 0.1); SimPO: the reward scale (paper: 2.0-2.5)."""
    label_smoothing: float = 0.0
    """The share of pairs taken as mislabelled (conservative DPO): the loss mixes in logsigmoid(-beta delta)."""
    gamma: float = 0.5
    """SimPO's target reward margin."""
    reference: str = "pass"
    """DPO's reference: ``pass`` (its log-probabilities computed in one forward pass before step 1, stored beside the
    shards) or ``copy`` (held on the ranks, run on every batch: without LoRA a frozen copy of the initial weights,
    sharded like the policy; with LoRA the base with the adapters off)."""


@dataclass
class TrainerConfig:
    max_steps: int = 200
    seed: int = 0
    log_every: int = 10
    measure_every: int = 10
    """The step measurements that cost time (tp's and cp's collective timers, DDP's reducer timer, the saved
    activations' hooks) run on logged steps, on the first logged step of each window of N steps (steps 1, 10, 20 ...
    with N=10): with trainer.log_every=1 one step in N pays for them. 1: every logged step."""
    checkpoint_every: int = 100
    """Save a checkpoint every N steps and at the last step; 0 disables checkpoints."""
    keep_checkpoints: int = 2
    resume: str = "auto"
    """auto (newest complete checkpoint in the run folder), never, or a checkpoint path."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 (or any value <= 0, or inf) disables clipping: the norm is still
    computed and logged as grad_norm."""
    objective: str = "tokens_per_s"
    """summary.json key the task returns to Hydra sweepers (val_loss: the final validation loss; needs
    trainer.eval_every > 0 and a sweeper that minimises); or a training objective on data=preference, dpo or simpo
    (trainer.preference), whose run returns its final validation loss (else its final loss) to sweepers."""
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    """trainer.objective=dpo / simpo: beta, label_smoothing, gamma."""
    callbacks: List[Any] = field(default_factory=list)
    """Trainer callbacks, each ``{_target_: module.Class, ...}`` (trainer/loop/callbacks.py: on_train_start,
    on_step_end, on_validation, on_checkpoint, on_train_end), called on every rank."""
    eval_every: int = 0
    """Validation loss (and perplexity) on the held-out split every N steps and at the last step; 0: never."""
    eval_batches: int = 4
    """Validation batches (of data.global_batch_size windows) per evaluation; the same batches each time."""
    prefetch: int = 2
    """Global batches built ahead in a background thread; 0 builds each in the loop (its time is data_time_s)."""
    stop_grace_s: float = 15.0
    """After SIGTERM/SIGUSR1, how long a rank may take to reach a step boundary before it just exits."""
    async_checkpoint: bool = False
    """Write checkpoint shards in the background (torch.distributed.checkpoint.async_save); the marker
    that makes a checkpoint complete follows when every shard is written (at the next save or the end)."""
    on_nonfinite: OnNonFinite = OnNonFinite["stop"]
    """stop or skip when the loss or gradient norm is not finite."""
    precision: Precision = Precision["fp32"]
    """fp32; bf16-mixed (bf16 compute, fp32 master weights, optimizer state and gradient reduction); bf16
    (parameters stored in bf16); or fp8 (bf16-mixed with the Linears' matmuls in float8, trainer.fp8). The loss is
    computed in fp32 in every mode. No fp16: it needs a loss scaler this trainer does not have (bf16 has fp32's
    range and needs none)."""
    fp8: FP8Config = field(default_factory=FP8Config)
    """How trainer.precision=fp8 trains (read only then)."""
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing["none"]
    """none, selective (ac_every=1: keep matmul outputs and recompute the rest, op by op; ac_every=k>1: recompute
    every k-th block in full) or full (recompute every block in backward)."""
    ac_every: int = 1
    """With activation_checkpointing=selective: 1 = op-level policy on every block, k > 1 = every k-th block."""
    compile: bool = False
    """torch.compile each block (regional compilation); compile time is reported apart (summary.json)."""
    profile_steps: List[int] = field(default_factory=list)
    """[a, b]: a torch.profiler trace per rank of steps a..b (and a CUDA memory snapshot on CUDA) in the
    run folder's profile/; empty = no profiling."""
    dry_run: bool = False
    """Build this layout for every rank (sampled ranks above 16) under torch's fake process group in this one
    process, report measured vs planned memory per rank (dry_run.json) and stop: no worker, no training."""


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode["disabled"]
    """offline (what logger=wandb, the default, sets here), online (needs an account), or disabled (no W&B run:
    the schema's value, so a logger option other than wandb leaves W&B off)."""
    project: str = "meshtrain"
    entity: Optional[str] = None
    group: Optional[str] = None
    """Defaults to the sweep folder name in multirun."""
    tags: List[str] = field(default_factory=list)
    init_timeout: float = 15.0
    """Seconds to wait for an online W&B server before falling back to offline."""
    answer_timeout_s: float = 60.0
    """Seconds rank 0 waits for W&B to answer (its start: init_timeout more; a checkpoint's artifact, the summary,
    the run's end) before it goes on without W&B, with a warning: the other ranks wait for rank 0 at its next
    collective (trainer/observe/wandb_client.py)."""
    system_stats: bool = False
    """W&B's system monitor (CPU/GPU/memory sampling). Its process competes with training on few
    cores (measured here: -49% tokens/s on 2 cores); turn it on for GPU nodes."""
    console: WandbConsole = WandbConsole["off"]
    """W&B console capture (off, wrap, redirect); logs/rank0.log already keeps the console."""
    save_requirements: bool = False
    """W&B's list of the installed packages (``requirements.txt`` among the run's files). Listing them costs
    rank 0 about 0.2 s of CPU while the first steps run; turn it on to keep the environment in the W&B run."""


@dataclass
class TensorBoardConfig:
    enabled: bool = False
    """Event files under ``<run>/<dir>/`` (logger=tensorboard, logger=wandb_tensorboard or
    logger=[wandb,tensorboard] turn it on)."""
    dir: str = "tensorboard"
    """The folder inside the run folder: ``tensorboard --logdir <run>/tensorboard``."""


@dataclass
class LoggerConfig:
    """The trackers beside the console and the run folder's files (trainer/observe/sinks.py): ``logger=`` picks one
    option (wandb, tensorboard, wandb_tensorboard, none) or several as a list (``logger=[wandb,tensorboard]``)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)


# ---- per-shape schemas for model / data / optim --------------------------------------------


@dataclass
class TextDataConfig:
    _target_: str = "trainer.data.datasets.TextCorpus"
    name: str = "text"
    path: Optional[str] = None
    """A UTF-8 text file (byte tokens), or a .npy / .bin token file; null = Python's own stdlib sources."""
    cache_dir: str = "${oc.env:MESHTRAIN_CACHE,${oc.env:HOME}/.cache/meshtrain}"
    max_bytes: int = 4_000_000
    """How much of the stdlib corpus to read (first run only; cached as a token file)."""
    val_fraction: float = 0.05
    """The last share of the tokens, held out as the validation split (never trained on)."""
    global_batch_size: int = 16
    """Samples the optimizer sees per step, whatever the layout."""
    micro_batch_size: Optional[int] = None
    """Samples per forward pass on one rank; null = no gradient accumulation (pp: from micro_batches)."""
    seq_len: int = 128
    packing: str = "none"
    """Byte text has no document boundaries: only ``none`` (``documents`` needs data=tokens or data=chat)."""


@dataclass
class TokensDataConfig:
    _target_: str = "trainer.data.datasets.TokenShards"
    name: str = "tokens"
    path: Optional[str] = None
    """A folder written by ``python -m trainer.data.prepare`` (metadata.json, tokenizer.json, shards)."""
    global_batch_size: int = 16
    micro_batch_size: Optional[int] = None
    seq_len: int = 128
    packing: str = "none"
    """``documents``: each window's documents (ended by the EOS) attend only within themselves, positions restarting
    at each; ``none``: windows read as one text (docs/data.md)."""


@dataclass
class ChatDataConfig:
    _target_: str = "trainer.data.chat.ChatData"
    name: str = "chat"
    path: Optional[str] = None
    """A .jsonl of conversations ({"messages": [{"role": ..., "content": ...}, ...]} per line), or a folder of them."""
    tokenizer: Optional[str] = "${oc.select:model.init_from,null}"
    """The folder whose tokenizer and chat template render the conversations (by default model.init_from)."""
    prepared: Optional[str] = None
    """Where the tokenized shards go; null: under cache_dir, named by a fingerprint of inputs and tokenizer."""
    cache_dir: str = "${oc.env:MESHTRAIN_CACHE,${oc.env:HOME}/.cache/meshtrain}/chat"
    val_fraction: float = 0.1
    """The share of the conversations held out as the validation split (a seeded draw)."""
    packing: str = "none"
    """``documents``: several conversations per row, each attending only within itself; ``none``: one per row."""
    global_batch_size: int = 16
    micro_batch_size: Optional[int] = None
    seq_len: int = 128


@dataclass
class PreferenceDataConfig:
    _target_: str = "trainer.data.preference.PreferenceData"
    name: str = "preference"
    path: Optional[str] = None
    """A .jsonl of preference pairs in TRL's forms (prompt/chosen/rejected as strings or message lists, or
    chosen/rejected with the prompt implicit), or a folder of them."""
    tokenizer: Optional[str] = "${oc.select:model.init_from,null}"
    """The folder whose tokenizer and chat template render the pairs (by default model.init_from)."""
    prepared: Optional[str] = None
    """Where the tokenized shards (and the reference log-probabilities) go; null: under cache_dir, named by a
    fingerprint of inputs and tokenizer."""
    cache_dir: str = "${oc.env:MESHTRAIN_CACHE,${oc.env:HOME}/.cache/meshtrain}/preference"
    val_fraction: float = 0.1
    """The share of the pairs held out as the validation split (a seeded draw)."""
    max_prompt_len: Optional[int] = None
    """Keep only a prompt's last N tokens (null: the whole prompt); a pair still longer than seq_len + 1 is refused."""
    global_batch_size: int = 16
    """Sequences per step, two per pair (chosen and rejected): even, and even per micro-batch."""
    micro_batch_size: Optional[int] = None
    seq_len: int = 128


@dataclass
class ImageDataConfig:
    _target_: str = "trainer.data.datasets.SyntheticImages"
    name: str = "images"
    path: Optional[str] = None
    global_batch_size: int = 32
    micro_batch_size: Optional[int] = None
    seq_len: int = 1
    """Images have no sequence; kept at 1 so throughput reads as samples/s."""
    image_size: int = 16
    channels: int = 3
    num_classes: int = 10
    noise: float = 0.5


@dataclass
class OptimConfig:
    _target_: str = "torch.optim.AdamW"
    """Any optimizer class: built as a partial, then called with the parameters (trainer/loop/optim.py)."""
    _partial_: bool = True
    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    warmup_steps: int = 10
    decay: Decay = Decay["cosine"]
    """After warm-up: cosine (CosineAnnealingLR), linear (LinearLR) or constant, down to lr * min_lr_ratio."""
    min_lr_ratio: float = 0.1
    scheduler: Optional[Any] = None
    """A torch LR scheduler as a partial ({_target_: torch.optim.lr_scheduler.StepLR, _partial_: true, ...});
    null: warmup_steps + decay."""
    implementation: OptimImplementation = OptimImplementation["auto"]
    """auto (torch's fused kernel where the optimizer and device have one), fused, foreach or for-loop
    (parallel/foundation/optimizer.py)."""


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    name: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: Decay = Decay["constant"]
    min_lr_ratio: float = 1.0
    scheduler: Optional[Any] = None
    implementation: OptimImplementation = OptimImplementation["auto"]


@dataclass
class MuonConfig:
    """``optim=muon`` (parallel/optim/muon.py): torch's Muon for the blocks' weight matrices, AdamW (``adamw_*``)
    for embeddings, the output head, norms, biases and routers; each with its own lr and weight decay."""

    _target_: str = "parallel.optim.muon.Muon"
    _partial_: bool = True
    name: str = "muon"
    lr: float = 0.02
    """Muon's lr, before torch's adjust_lr_fn scales it per matrix shape."""
    weight_decay: float = 0.0
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: List[float] = field(default_factory=lambda: [3.4445, -4.7750, 2.0315])
    """torch.optim.Muon's defaults (Keller Jordan's quintic Newton-Schulz coefficients)."""
    eps: float = 1e-7
    adjust_lr_fn: AdjustLrFn = AdjustLrFn["original"]
    """torch's names: original (sqrt(max(1, rows / cols)), torch's default) or match_rms_adamw (0.2 sqrt(max dim))."""
    adamw_lr: float = 3e-3
    adamw_weight_decay: float = 0.0
    adamw_betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = 1e-8
    muon_gather: MuonGather = MuonGather["spread"]
    """How a sharded matrix becomes whole: spread (each matrix orthogonalised by one owner rank, gathered to it and
    scattered back) or everywhere (every rank gathers and orthogonalises every matrix)."""
    warmup_steps: int = 10
    decay: Decay = Decay["cosine"]
    min_lr_ratio: float = 0.1
    scheduler: Optional[Any] = None
    implementation: OptimImplementation = OptimImplementation["auto"]
    """The AdamW part's kernels (parallel/foundation/optimizer.py)."""


#: keys of an optim node that meshtrain reads (the schedule, the kernels), not the optimizer constructor
NOT_OPTIMIZER_KEYS = ("name", "warmup_steps", "decay", "min_lr_ratio", "scheduler", "implementation")


def _dimension_groups() -> list[tuple[str, type, Any]]:
    """One root field per mesh dimension (``dp``, ``tp``, ``pp``), typed by the class its row of
    ``parallel/foundation/dims.py`` names: a new dimension's config group needs no line here."""
    out = []
    for d in dims.DIMENSIONS:
        cls = import_object(d.config)
        out.append((d.key.partition(".")[0], cls, field(default_factory=cls)))
    return out


@dataclass
class _Groups:
    """The root's groups other than the mesh dimensions'."""

    mp: MPConfig = field(default_factory=MPConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING


#: the root: every group, typed: ``parallel``, one group per mesh dimension, then ``_Groups``' fields
MeshtrainConfig = make_dataclass(
    "MeshtrainConfig",
    [("parallel", ParallelConfig, field(default_factory=ParallelConfig)), *_dimension_groups()]
    + [(f.name, get_type_hints(_Groups)[f.name], f) for f in fields(_Groups)],
)
MeshtrainConfig.__module__ = __name__


#: the keys that name a file or folder of the user's (each with the words it takes that are no path): ``~`` expanded,
#: and a relative path read against the folder the command ran in, also when ``hydra.job.chdir=true`` moves the job
#: into its run folder (trainer/task.py ``user_paths``); on the command line ``~`` is expanded before Hydra parses
#: it (conf/command_line.py)
USER_PATH_KEYS = {
    "model.init_from": (),
    "data.path": (),
    "data.tokenizer": (),
    "data.prepared": (),
    "data.cache_dir": (),
    "trainer.resume": ("auto", "never"),
}

#: schemas live under their own path, ``schema/<group>/<shape>``, not among a group's options: ``--help``
#: and shell completion list only the YAML options. An option extends one with ``/schema/model/gpt@_here_``.
SCHEMA_ROOT = "schema"


#: what ``register_configs`` stored in this process: (group, name) -> (the schema class, the ConfigStore's entry made
#: of it). Storing builds an OmegaConf structured config (~0.2 s for them all here, under load): a schema whose class and entry
#: are still those is not stored again. A new class (a family registered since) or a store that lost the entry is.
_STORED: dict[tuple[str | None, str], tuple[Any, Any]] = {}


def _entry(cs: ConfigStore, group: str | None, name: str) -> Any:
    node: Any = cs.repo
    for part in group.split("/") if group else ():
        node = node.get(part) if isinstance(node, dict) else None
    return node.get(f"{name}.yaml") if isinstance(node, dict) else None


def _store(cs: ConfigStore, *, name: str, node: Any, group: str | None = None) -> None:
    held = _entry(cs, group, name)
    stored_node, stored_entry = _STORED.get((group, name), (None, None))
    if held is None or held is not stored_entry or node is not stored_node:
        cs.store(name=name, node=node, group=group)
        _STORED[(group, name)] = (node, _entry(cs, group, name))


def register_configs() -> None:
    cs = ConfigStore.instance()
    _store(cs, name="meshtrain_schema", node=MeshtrainConfig)
    for name, node in model_schemas().items():  # every family registered by now
        _store(cs, group=f"{SCHEMA_ROOT}/model", name=name.removesuffix("_schema"), node=node)
    _store(cs, group=f"{SCHEMA_ROOT}/data", name="text", node=TextDataConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/data", name="tokens", node=TokensDataConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/data", name="images", node=ImageDataConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/data", name="chat", node=ChatDataConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/data", name="preference", node=PreferenceDataConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/optim", name="adamw", node=OptimConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/optim", name="sgd", node=SGDConfig)
    _store(cs, group=f"{SCHEMA_ROOT}/optim", name="muon", node=MuonConfig)
