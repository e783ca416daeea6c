"""``meshtrain --help``: the groups and their options as Hydra finds them (conf/ plus ``--config-dir``,
schemas left out), and the main keys with the values their enum types accept. Used through two
resolvers in ``conf/hydra/help/meshtrain.yaml``, which build them only when the command line asks for --help
(``conf/resolvers.py``: Hydra resolves them at every compose).
"""

from __future__ import annotations

import textwrap

#: (key, what) shown under "Main keys"; ``{choices}`` is replaced by the values the key's enum type accepts; the
#: parallel degrees' lines come first, from the mesh dimensions' table (``degree_keys``)
MAIN_KEYS = (
    ("pp.micro_batches", "micro-batches per step (pipeline)"),
    ("pp.schedule", "{choices}"),
    ("pp.split_points=[2]", "blocks where a stage starts; empty: pp.split={choices:pp.split} decides"),
    ("trainer.max_steps trainer.seed", "also trainer.log_every, trainer.checkpoint_every"),
    ("trainer.resume", "auto (newest checkpoint in the run folder) | never | PATH"),
    ("trainer.on_nonfinite", "{choices}"),
    ("data.global_batch_size data.seq_len", "data.path: your own text or token file"),
    ("optim.lr optim.warmup_steps", "optim._target_: any torch.optim class"),
    ("optim.decay", "{choices}, to optim.min_lr_ratio (torch LR schedulers)"),
    ("topology.nproc_per_node", "also topology.nnodes, topology.node_rank (multi-node)"),
    ("topology.device", "{choices}; topology.backend={choices:topology.backend}"),
    ("logger.wandb.mode", "{choices}"),
    ("model.init_from", "a Hugging Face folder (config.json, safetensors): its model, weights"),
    ("model.lora.rank", "LoRA adapters on frozen weights; also .alpha, .dropout, .targets"),
)

HIDDEN_ROOTS = ("hydra", "schema")
#: the widest help line
WIDTH = 110


def _enum_choices(dotted: str) -> str:
    """``a|b|c``: the values of the enum type of a key (``optim.decay`` ...), read from the schemas."""
    from conf.schema import MeshtrainConfig, OptimConfig, TextDataConfig

    roots = {"optim": OptimConfig, "data": TextDataConfig}  # groups typed per option: their default shape
    node: object = MeshtrainConfig
    for i, part in enumerate(dotted.split(".")):
        if i == 0 and part in roots:
            node = roots[part]
            continue
        f = getattr(node, "__dataclass_fields__", {}).get(part)
        if f is None:
            return "?"
        value = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        node = type(value) if hasattr(value, "__dataclass_fields__") else value
    values = getattr(type(node), "values", None)
    return "|".join(values()) if callable(values) else "?"


def degree_keys() -> tuple[tuple[str, str], ...]:
    """The degrees' lines: the dimensions that multiply the world size, then each that borrows its ranks."""
    from parallel.foundation import dims

    keys = " ".join(dims.dim(n).key for n in dims.multiplying())
    lines = [(keys, f"parallel degrees; the world size is {' x '.join(dims.multiplying())}")]
    for name in dims.borrowing():
        d = dims.dim(name)
        lines.append((d.key, f"{d.summary.split(':')[0]}: ranks borrowed from {' x '.join(d.borrows)}, none added"))
    return tuple(lines)


def help_keys() -> str:
    def fill(key: str, text: str) -> str:
        text = text.replace("{choices}", _enum_choices(key))
        while "{choices:" in text:
            start = text.index("{choices:")
            end = text.index("}", start)
            text = text[:start] + _enum_choices(text[start + 9 : end]) + text[end + 1 :]
        return text

    return "\n".join(f"  {key:<36} {fill(key, text)}" for key, text in (*degree_keys(), *MAIN_KEYS))


def help_groups() -> str:
    """``group: opt1, opt2`` for every group Hydra can compose (schemas and Hydra's own left out)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    if not GlobalHydra.instance().is_initialized():
        return "  (run through meshtrain / python train.py to list the groups)"
    loader = GlobalHydra.instance().config_loader()

    def walk(parent: str) -> list[str]:
        out = []
        for group in sorted(loader.list_groups(parent)):
            name = f"{parent}/{group}" if parent else group
            if name.split("/")[0] in HIDDEN_ROOTS:
                continue
            if loader.get_group_options(name, ObjectType.CONFIG):
                out.append(name)
            out.extend(walk(name))
        return out

    def line(group: str) -> str:  # long option lists wrap under themselves, to fit one screen's width
        options = ", ".join(sorted(loader.get_group_options(group, ObjectType.CONFIG)))
        return textwrap.fill(options, width=WIDTH, initial_indent=f"  {group:<14} ", subsequent_indent=" " * 17)

    return "\n".join(line(g) for g in walk(""))
