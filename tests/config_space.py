"""The config space drawn by the property tests (tests/system/test_config_space_refusals.py: every draw is
accepted or refused naming a key; tests/integration/test_config_space_runs.py: accepted draws run).

The overrides are drawn key by key from valid values and, less often, from the kinds of bad input a
user types: non-positive sizes, negative learning rates and decays, betas outside [0, 1), unknown
choices (decay, schedule, objective, misspelled keys), mismatched model/data, wrong list lengths, strings
where numbers belong, contradicting layouts and topologies.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from tests.composing import Composer
from tests.helpers import CONF

#: coherent layouts (parallel, sizes): most draws start from one of these
LAYOUTS = [
    ("parallel=single",),
    ("parallel=ddp", "dp.size=2"),
    ("parallel=fsdp", "dp.size=2"),
    ("parallel=tp", "tp.size=2"),
    ("parallel=pp", "pp.size=2", "pp.micro_batches=2"),
    ("parallel=mp", "pp.size=2", "pp.micro_batches=1", "pp.schedule=gpipe"),
    ("parallel=hybrid", "dp.size=2", "pp.size=2", "pp.micro_batches=2"),
    ("parallel=hybrid", "dp.size=2", "tp.size=2"),
    ("parallel=hybrid", "tp.size=2", "pp.size=2", "pp.micro_batches=2"),
    ("parallel=dp", "topology.nproc_per_node=1"),
]
PAIRS = [("model=gpt_small", "data=text")] * 3 + [("model=cnn_bn", "data=images")]
OPTIMS = ["optim=adamw"] * 3 + ["optim=sgd"]

#: key -> (values that may work, values a worker or the schema would reject). Good values combine into
#: contradictions too (micro_batch_size with micro_batches, tp.size with the CNN ...).
SPACE: dict[str, tuple[list, list]] = {
    "parallel": (["single", "ddp", "fsdp", "tp", "pp", "mp", "hybrid"], ["dp", "auto2"]),
    "model": (["gpt_small", "cnn_bn"], ["gpt_nonexistent"]),
    "data": (["text", "images"], []),
    "optim": (["adamw", "sgd"], []),
    "dp.size": ([1, 2], [0, 3, 4, "two"]),
    "tp.size": ([1, 2], [0, 3]),
    "pp.size": ([1, 2], [-1, 3]),
    "dp.shard": (["true", "false"], ["maybe"]),
    "dp.bucket_cap_mb": (["null", 25, 0.5], [0, -1, "nan", "big"]),
    "tp.sequence_parallel": (["true", "false"], []),
    "tp.loss_parallel": (["true", "false"], []),
    "topology.nproc_per_node": (["null"], [1, 3, 0]),
    "topology.node_rank": ([0], [1, 5, -1]),
    "topology.master_port": ([0], [70000, -5]),
    "topology.max_restarts": ([0, 1], [-1]),
    "pp.micro_batches": ([1, 2, 4], [0, 3]),
    "pp.schedule": (["gpipe", "1f1b"], ["1f1bb", "zbv", "interleaved_1f1b"]),
    "pp.stages_per_rank": ([1], [2, 0]),
    "pp.split_points": (["[]", "auto"], ["[0]", "[9]", "[1,1]", "[1,2,3]", "[2]"]),
    "pp.split": (["uniform"], ["balanced", "random"]),
    "model.n_layers": ([2, 4], [0, 1]),
    "model.d_model": ([32, 64], [30, 0]),
    "model.n_heads": ([2, 4], [3, 0]),
    "model.d_ff": ([0, 64], [30, -1]),
    "model.layer_d_ff": (["[]"], ["[64,32,64,32]", "[64]", "[64,64,64,64,64]", "[0,0,0,0]"]),
    "model.dropout": ([0.0, 0.1], [1.0, -0.1]),
    "model.vocab_size": ([256], [100, 0]),
    "model.channels": (["[8,16]", "[8]"], ["[]", "[0]", "[8,8,8,8,8]"]),
    "data.global_batch_size": ([8, 16], [0, 6, 7, 15]),
    "data.micro_batch_size": (["null", 2, 4], [3, 0]),
    "data.seq_len": ([16, 32], [0, 64, 200]),
    "data.image_size": ([16, 8], [2, 0]),
    "data.noise": ([0.5], [-1.0]),
    "optim.lr": ([3e-3, 1e-2], [-1, "nan", "inf", "fast"]),
    "optim.weight_decay": ([0.0, 0.1], [-0.1, "nan"]),
    "optim.betas": (["[0.9,0.95]"], ["[1.0,0.9]", "[-0.1,0.9]", "[0.9]"]),
    "optim.eps": ([1e-8], [0, -1]),
    "optim.momentum": ([0.9, 0.0], [1.5]),
    "optim.decay": (["cosine", "constant"], ["linearr", "linear"]),
    "optim.min_lr_ratio": ([0.1, 1.0, 0.0], [1.5, -0.1]),
    "optim.warmup_steps": ([0, 1], [-1]),
    # fused: refused with SGD over FSDP2's or TP's DTensors (torch shards Adam's and AdamW's kernel only)
    "optim.implementation": (["auto", "fused", "foreach", "for-loop"], ["fast", "loop"]),
    "trainer.max_steps": ([2], [0, -3]),
    "trainer.log_every": ([1], [0]),
    "trainer.checkpoint_every": ([0, 1], [-1]),
    "trainer.keep_checkpoints": ([1, 2], [0]),
    "trainer.grad_clip": ([1.0, 0.0, -1.0, "inf"], ["nan"]),
    "trainer.objective": (["tokens_per_s", "final_loss"], ["loss", "tokens/s", "mfu"]),
    "trainer.on_nonfinite": (["stop", "skip"], ["ignore"]),
    "trainer.precision": (["fp32"], ["fp16", "bf16_mixed"]),
    "trainer.activation_checkpointing": (["none"], ["some"]),
    "trainer.stop_grace_s": ([15.0], [-1.0]),
    "topology.backend": (["auto", "gloo"], ["nccl", "mpi"]),
    "topology.device": (["auto", "cpu"], ["tpu"]),
    "logger.wandb.console": (["off", "wrap"], ["loud"]),
    "logger.wandb.init_timeout": ([15], [0]),
    "+trainer.max_step": ([], [2]),
    "trainer.max_step": ([], [2]),
}
GROUPS = ("parallel", "model", "data", "optim")
BAD = [(k, v) for k, (_, bad) in SPACE.items() for v in bad]
#: keys only one model family, data kind or optimizer has (set elsewhere, the schema refuses them)
ONLY = {
    "cnn_bn": ("model.channels", "data.image_size", "data.noise"),
    "gpt_small": tuple(
        f"model.{k}" for k in ("n_layers", "d_model", "n_heads", "d_ff", "layer_d_ff", "dropout", "vocab_size")
    ),
    "sgd": ("optim.momentum",),
    "adamw": ("optim.betas", "optim.eps"),
}


def tweaks_for(*choices: str) -> list[str]:
    """Keys with values that may work, for this model and optimizer."""
    foreign = {k for name, keys in ONLY.items() if name not in choices for k in keys}
    return [k for k, (good, _) in SPACE.items() if good and k not in GROUPS and k not in foreign]


def overrides():
    """The hypothesis strategy of ``_draw`` (hypothesis is imported here, not when tests/ modules are collected: the
    unit tier's other worker never needs its 1-2 s import)."""
    from hypothesis import strategies as st

    return st.composite(_draw)()


def _draw(draw) -> list[str]:
    """A coherent layout and model/data pair (usually), a few tweaks from the values that may work,
    and 0-2 values of the kinds a worker or the schema would reject."""
    from hypothesis import strategies as st

    pair, optim = draw(st.sampled_from(PAIRS)), draw(st.sampled_from(OPTIMS))
    out = [*draw(st.sampled_from(LAYOUTS)), *pair, optim]
    choices = [o.split("=")[1] for o in (*pair, optim)]
    for key in draw(st.lists(st.sampled_from(tweaks_for(*choices)), max_size=6, unique=True)):
        out.append(f"{key}={draw(st.sampled_from(SPACE[key][0]))}")
    if draw(st.integers(0, 5)) == 0:  # a model/data or group change away from the coherent start
        key = draw(st.sampled_from(GROUPS))
        out.append(f"{key}={draw(st.sampled_from(SPACE[key][0] + SPACE[key][1]))}")
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        key, value = draw(st.sampled_from(BAD))
        out.append(f"{key}={value}")
    # a group chosen twice: the last choice counts (as one `model=...` on a command line)
    last = {o.split("=")[0]: i for i, o in enumerate(out) if o.split("=")[0] in GROUPS}
    return [o for i, o in enumerate(out) if o.split("=")[0] not in GROUPS or last[o.split("=")[0]] == i]


@contextlib.contextmanager
def composer():
    """Compose conf/ as train.py does, many times, in this process."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield Composer(CONF)  # group choices composed once, key=value overrides by Hydra's own code
    GlobalHydra.instance().clear()


KEY_VALUE = re.compile(r"(?<![\w.])([a-z_]+(?:\.[a-z_0-9]+)*)=")


def config_keys(cfg) -> set[str]:
    """Every dotted key of ``cfg`` (and the group names, which `model=...` style messages use)."""
    from omegaconf import DictConfig

    keys = set(GROUPS)

    def walk(node, prefix):
        for k in node.keys():
            path = f"{prefix}{k}"
            keys.add(path)
            try:
                child = node._get_node(k)
            except Exception:  # noqa: BLE001
                continue
            if isinstance(child, DictConfig):
                walk(child, path + ".")

    walk(cfg, "")
    return keys


def outcome(composer, ovs: list[str], tmp: Path) -> tuple[str, str]:
    """("accepted", "") or ("refused", message): what train.py does before starting a worker.
    Raises anything that train.py would not turn into exit code 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from trainer.checkpoint.files import CheckpointError
    from trainer.data.datasets import DataError
    from trainer.observe.startup import StartClock
    from trainer.task import preflight
    from trainer.validate import ConfigError

    try:
        cfg = composer(ovs)
    except (HydraException, OmegaConfBaseException) as exc:  # train.py exits 2 when overrides do not compose
        msg = f"{exc} {exc.__cause__ or ''}"
        named = [o.split("=")[0].lstrip("+") for o in ovs if o.split("=")[0].lstrip("+") in msg]
        assert named, f"compose error names no override key: {msg}"
        return "refused", msg
    try:
        preflight(cfg, run_dir=tmp, clock=StartClock.for_job(multirun=True))
    except ConfigError as exc:  # exit 2 (trainer/task.py)
        keys = config_keys(cfg)
        for problem in exc.problems:
            named = [k for k in KEY_VALUE.findall(problem) if k in keys]
            assert named, f"problem names no config key: {problem!r} (overrides {ovs})"
        return "refused", str(exc)
    except (DataError, CheckpointError) as exc:  # exit 2 as well
        assert KEY_VALUE.search(str(exc)), str(exc)
        return "refused", str(exc)
    return "accepted", ""
