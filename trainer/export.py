"""``python -m trainer.export SRC --hf OUT`` (also ``meshtrain export SRC --hf OUT``): a meshtrain checkpoint, saved
under any layout, as a Hugging Face model folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

SRC is a run folder (its newest complete checkpoint) or a ``checkpoints/step_N`` folder. One process, no workers:
DCP reassembles every full tensor from whichever shards hold it (any dp/tp/pp layout wrote them); the model
family's adapter (``ModelSpec.hf_adapter``) names them and writes ``config.json`` (over the config.json the run
started from, if it did: token ids and context length kept). OUT gets ``config.json``, ``generation_config.json``,
``model.safetensors`` (shards and an index past ``--max-shard-size``) and the run's tokenizer
(``trainer/hf/tokenizer.py``), whose bos/eos/pad and context length agree with config.json's. Weights are written
in fp32, or bf16 with ``--dtype bf16``. A non-empty OUT is refused unless ``--overwrite``, which first removes the
weight files, index and tokenizer files an earlier export left there (a loader globbing ``*.safetensors`` would
read stale shards beside the new file).

A LoRA run (``model.lora.rank > 0``, ``models/lora.py``) exports its adapters as a PEFT adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained(base, OUT)`` loads
over the folder the run started from; ``--merge`` folds them into the weights and writes a whole model instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from models.hf_adapter import HFConfigError
from models.lora import LoRA, merged_state
from models.registry import spec_for
from trainer.checkpoint.files import (
    MARKER,
    CheckpointError,
    checkpoints_root,
    complete_checkpoints,
    damaged_checkpoints,
    read_marker,
)
from trainer.data.user_files import COPY_AGAIN, read_json_object
from trainer.hf.folder import (
    CONFIG,
    GENERATION_CONFIG,
    INDEX,
    MAX_SHARD_BYTES,
    HFFolderError,
    write_weights,
)
from trainer.hf.tokenizer import TOKENIZER_FILES, reconcile, write_tokenizer

#: --dtype NAME -> (torch dtype name, config.json's "dtype")
DTYPES = {"fp32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16")}
#: files of an earlier export (or a save_pretrained) that --overwrite removes before writing
STALE_PATTERNS = ("*.safetensors", "*.bin", "*.bin.index.json", INDEX, CONFIG, GENERATION_CONFIG, *TOKENIZER_FILES)
#: a PEFT adapter folder's files (also removed by --overwrite)
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
STALE_PATTERNS += (ADAPTER_CONFIG,)


class ExportError(ValueError):
    """SRC or OUT cannot be used; the message names the path and the fix."""


def find_checkpoint(src: str | Path) -> Path:
    """``src`` itself when it is a checkpoint, else the newest complete checkpoint of the run folder ``src``."""
    path = Path(src).expanduser()
    if (path / MARKER).is_file():
        return path
    found = complete_checkpoints(checkpoints_root(path))
    if found:
        return found[-1][1]
    passed = [f"{p.name} {problem}" for p, problem in damaged_checkpoints(checkpoints_root(path))]
    if passed:
        raise CheckpointError(
            f"{src}: no complete checkpoint: {'; '.join(passed)}; copy the run folder again, or export another run"
        )
    raise ExportError(
        f"{src}: neither a checkpoint (no {MARKER}) nor a run folder with a complete checkpoint under "
        f"{checkpoints_root(path)}; give a run folder trained with trainer.checkpoint_every > 0, or a checkpoints/step_N "
        "folder"
    )


def checkpoint_model(checkpoint: Path) -> dict[str, Any]:
    """The model config the checkpoint's marker records (checked whole and complete first)."""
    model = read_marker(checkpoint).get("model")
    if not isinstance(model, dict):
        raise CheckpointError(f"checkpoint {checkpoint}: its {MARKER} names no model; it is not a meshtrain checkpoint")
    return model


def run_config(checkpoint: Path) -> Any:
    """The Hydra config of the run that wrote ``checkpoint`` (``<run>/.hydra/config.yaml``), or None."""
    path = checkpoint.parent.parent / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # noqa: BLE001 - yaml's scanner errors, OmegaConf's: the file is damaged either way
        raise ExportError(
            f"{path}: the run's config cannot be read ({type(exc).__name__}: {exc}); {COPY_AGAIN}"
        ) from None
    if not isinstance(cfg, DictConfig) or not isinstance(cfg.get("data", {}), (dict, DictConfig)):
        raise ExportError(f"{path}: not a run's config (no data section of keys); {COPY_AGAIN}")
    return cfg


def full_state(checkpoint: Path) -> dict[str, Any]:
    """Every model tensor of ``checkpoint``, whole, by FQN (in the dtype it was saved in)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: named on its own
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.checkpoint.checkpointer import dcp_failure, read_dcp_metadata

    entries = read_dcp_metadata(checkpoint).state_dict_metadata
    try:
        state = {
            key[len("model.") :]: torch.empty(tuple(md.size), dtype=md.properties.dtype)
            for key, md in entries.items()
            if key.startswith("model.") and isinstance(md, TensorStorageMetadata)
        }
        with warnings.catch_warnings():  # "torch.distributed is disabled ... load in a single process": intended
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"model": state}, checkpoint_id=str(checkpoint), no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - unpickling, a missing file: all one answer
        raise CheckpointError(
            f"checkpoint {checkpoint}: its torch.distributed.checkpoint files (*.distcp) cannot be read "
            f"({dcp_failure(exc)}); export an earlier checkpoint, or copy the folder again"
        ) from None
    return state


def starting_config(model: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A JSON file of the folder the run started from (``model.init_from``), when it is still there."""
    start = model.get("init_from")
    path = Path(str(start)).expanduser() / name if start else None
    return read_json_object(path, error=ExportError) if path is not None and path.is_file() else None


def prepare_target(out: str | Path, *, overwrite: bool) -> Path:
    """``out``, created; a non-empty one refused unless ``overwrite``, which removes an earlier export's files."""
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise ExportError(f"--hf {out}: is a file, not a folder; give a folder to write the model into")
    present = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
    if present and not overwrite:
        shown = ", ".join(present[:6]) + (f" and {len(present) - 6} more" if len(present) > 6 else "")
        raise ExportError(
            f"--hf {out}: the folder is not empty ({shown}); give an empty or new folder, or add --overwrite to "
            "replace the model in it (its weight files, index, configs and tokenizer are removed first)"
        )
    for pattern in STALE_PATTERNS:
        for path in target.glob(pattern):
            if path.is_file():
                path.unlink()
    target.mkdir(parents=True, exist_ok=True)
    return target


def context_length(config: dict[str, Any]) -> int:
    """The context length config.json declares (GPT-2 names it n_positions)."""
    return int(config.get("max_position_embeddings") or config["n_positions"])


def export(
    src: str | Path,
    out: str | Path,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    dtype: str = "fp32",
    overwrite: bool = False,
    merge: bool = False,
    log=print,
) -> Path:
    """Write the Hugging Face folder ``out`` from the checkpoint ``src`` names (a LoRA run's: a PEFT adapter folder,
    or with ``merge`` the adapters folded into a whole model); returns ``out``."""
    import torch

    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: not one of {', '.join(DTYPES)}")
    checkpoint = find_checkpoint(src)
    model = checkpoint_model(checkpoint)
    adapter = spec_for(model).hf_adapter_obj()
    lora = LoRA.of(model)
    if lora is not None and not merge:
        return export_adapters(checkpoint, model, out, lora=lora, dtype=dtype, overwrite=overwrite, log=log)
    try:
        config = adapter.hf_config(model, base=starting_config(model, CONFIG))
    except (KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint {checkpoint}: the model its {MARKER} describes lacks or mistypes {exc} (an edited marker); "
            "export an earlier checkpoint"
        ) from None
    config["dtype"] = DTYPES[dtype][1]
    target = prepare_target(out, overwrite=overwrite)
    cast = getattr(torch, DTYPES[dtype][0])
    state = full_state(checkpoint)
    if lora is not None:
        state = merged_state(state, lora)
    state = {k: v.to(cast) for k, v in state.items()}
    tensors = adapter.to_hf(state, model)
    run = run_config(checkpoint)
    tokenizer = write_tokenizer(target, data=run.data if run is not None else None, model=model)
    if tokenizer and tokenizer["eos_token_id"] is not None and config.get("eos_token_id") is None:
        config["eos_token_id"] = tokenizer["eos_token_id"]
    if tokenizer:
        start = model.get("init_from")
        reconcile(
            target,
            config,
            context=context_length(config),
            start=Path(str(start)).expanduser() if start else None,
            default_eos=tokenizer.get("default_eos"),
        )
    generation = {**(starting_config(model, GENERATION_CONFIG) or {})}
    generation.update({k: config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
    (target / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    (target / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    files = write_weights(target, tensors, max_shard_bytes=max_shard_bytes)
    log(f"exported {checkpoint} ({model.get('name')}, {adapter.architecture}, {dtype}) to {target}: {', '.join(files)}")
    log(f"tokenizer: {tokenizer['source'] if tokenizer else 'none (the run data names no tokenizer meshtrain knows)'}")
    return target


def export_adapters(
    checkpoint: Path, model: dict[str, Any], out: str | Path, *, lora: LoRA, dtype: str, overwrite: bool, log=print
) -> Path:
    """A PEFT adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors`` holding each adapter under
    the Hugging Face name of the layer it adapts (``lora_B``'s rows in HF's order, as its base weight's)."""
    import torch
    from safetensors.torch import save_file

    from models.hf_adapter import Source

    start = model.get("init_from")
    if not start:
        raise ExportError(
            "this LoRA run did not start from a Hugging Face folder (model.init_from), so a PEFT adapter has no base "
            "model to name; export with --merge for a whole model"
        )
    adapter = spec_for(model).hf_adapter_obj()
    state = full_state(checkpoint)
    cast = getattr(torch, DTYPES[dtype][0])
    tensors, modules = {}, []
    for key in sorted(k for k in state if k.endswith(".lora_A.weight")):
        module = key[: -len(".lora_A.weight")]
        src = adapter.source(f"{module}.weight", model)
        if not isinstance(src, Source) or src.transpose or src.parts > 1:
            raise ExportError(
                f"{module}: its Hugging Face weight is fused or transposed ({src}), which a PEFT adapter of this "
                "layer cannot express; export with --merge"
            )
        name = src.key[: -len(".weight")]
        b = state[f"{module}.lora_B.weight"]
        hf_b = b.new_zeros(b.shape)
        src.put(hf_b, b)  # the rotary permutation of q/k rows, as for the base weight
        tensors[f"base_model.model.{name}.lora_A.weight"] = state[key].to(cast).contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = hf_b.to(cast).contiguous()
        modules.append(name)
    target = prepare_target(out, overwrite=overwrite)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(Path(str(start)).expanduser()),
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
    }
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(target / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    log(f"exported {checkpoint}'s LoRA adapters ({len(modules)} layers, rank {lora.rank}, {dtype}) to {target} (PEFT)")
    return target


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2000000`` -> bytes (decimal units, as transformers' max_shard_size)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
    text = text.strip().upper()
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="a run folder (its newest checkpoint) or a checkpoints/step_N folder")
    p.add_argument("--hf", required=True, metavar="OUT", help="the Hugging Face model folder to write")
    p.add_argument("--max-shard-size", default="5GB", help="split the weights into shards past this size (5GB)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="the weights' dtype (fp32)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty folder, removing its weight files, index, configs and tokenizer first",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: fold the adapters into the weights and write a whole model (default: a PEFT adapter folder)",
    )
    args = p.parse_args(argv)
    try:
        export(
            args.src,
            args.hf,
            max_shard_bytes=parse_size(args.max_shard_size),
            dtype=args.dtype,
            overwrite=args.overwrite,
            merge=args.merge,
        )
    except (ExportError, CheckpointError, HFConfigError, HFFolderError, ValueError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
