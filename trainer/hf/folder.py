"""A Hugging Face model folder on disk: ``config.json`` and ``model.safetensors``, or shards listed by
``model.safetensors.index.json``.

Opening one reads the JSON headers only (no torch): names, dtypes and shapes for the checks before any worker
starts. ``read(key, index)`` returns just the requested slice of one tensor (safetensors reads the bytes of
those rows and columns from the file, opened for that read and closed after it, so a rank never maps more than
the tensor it is reading). ``write_weights`` is the other direction: one file, or shards and an index past a
size limit, as ``save_pretrained`` writes them.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.data.user_files import COPY_AGAIN, read_json_object

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: shard size past which the exporter splits the weights (transformers' save_pretrained default)
MAX_SHARD_BYTES = 5 * 10**9


class HFFolderError(ValueError):
    """Not a readable Hugging Face model folder; the message names the path and what it should hold."""


#: what a safetensors header entry holds (besides ``__metadata__``)
ENTRY_KEYS = {"dtype": str, "shape": list, "data_offsets": list}
#: bytes per element of the common safetensors dtypes (by their names in the header)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
DTYPE_BYTES.update({"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1})
#: the stored dtypes a model's weights may have: float ones, cast on reading
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then the JSON), checked against the
    file's size: a file shorter than its header says (a copy cut short) is refused here, not in a worker's read."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise HFFolderError(
                    f"{path}: truncated: its header says {length} bytes of JSON but the file has {size}; {COPY_AGAIN}"
                )
            header = json.loads(f.read(length))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFFolderError(
            f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc}); {COPY_AGAIN}"
        ) from None
    problem = header_problem(header)
    if problem:
        raise HFFolderError(f"{path}: not a safetensors header: {problem}; {COPY_AGAIN}")
    ends = [info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"]
    need = 8 + length + max(ends, default=0)
    if size < need:
        raise HFFolderError(
            f"{path}: truncated: its header describes {need} bytes of tensors but the file has {size}; the copy is "
            "incomplete: copy or download it again"
        )
    return header


def header_problem(header: Any) -> str | None:
    """What makes a parsed safetensors header unusable (None: nothing): each tensor's entry must hold a dtype name,
    a shape of sizes and two data offsets."""
    if not isinstance(header, dict):
        return f"a JSON {type(header).__name__}, not an object"
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict) or any(not isinstance(info.get(k), t) for k, t in ENTRY_KEYS.items()):
            return f"the entry of {key} is {info!r}, not {{'dtype': ..., 'shape': [...], 'data_offsets': [begin, end]}}"
        numbers = [*info["shape"], *info["data_offsets"]]
        if len(info["data_offsets"]) != 2 or any(not isinstance(n, int) or n < 0 for n in numbers):
            return (
                f"{key} has shape {info['shape']} and data_offsets {info['data_offsets']}, not sizes and [begin, end]"
            )
        begin, end = info["data_offsets"]
        want = math.prod(info["shape"]) * DTYPE_BYTES.get(info["dtype"], 0)
        if info["dtype"] in DTYPE_BYTES and end - begin != want:  # another dtype: the float check names a weight's
            return (
                f"{key}: {end - begin} bytes between its data_offsets, but a {info['dtype']} {info['shape']} has {want}"
            )
    return None


class HFFolder:
    """The config and the tensors' names, dtypes and shapes of one folder; slices read on demand."""

    def __init__(self, path: str | Path, *, what: str = "model.init_from"):
        self.path = Path(path).expanduser()
        hint = f"give a Hugging Face model folder holding {CONFIG} and {WEIGHTS} (or shards with {INDEX})"
        if not self.path.is_dir():
            raise HFFolderError(f"{what}={path}: no such folder; {hint}")
        if not (self.path / CONFIG).is_file():
            raise HFFolderError(f"{what}={path}: no {CONFIG} in it; {hint}")
        self.tensors = self._tensors(what, hint)

    def _tensors(self, what: str, hint: str) -> dict[str, TensorInfo]:
        if (self.path / INDEX).is_file():
            weight_map = self._weight_map(what)
            files = sorted(set(weight_map.values()))
        elif (self.path / WEIGHTS).is_file():
            files = [WEIGHTS]
        else:
            other = sorted(p.name for p in self.path.glob("*.bin"))
            extra = (
                f" (it has {', '.join(other)}: re-save it with save_pretrained(safe_serialization=True))"
                if other
                else ""
            )
            raise HFFolderError(f"{what}={self.path}: no {WEIGHTS} or {INDEX}{extra}; {hint}")
        out: dict[str, TensorInfo] = {}
        for name in files:
            path = self.path / name
            if not path.is_file():
                raise HFFolderError(
                    f"{what}={self.path}: {INDEX} lists {name}, which is missing; the copy is incomplete"
                )
            try:
                header = read_header(path)
            except HFFolderError as exc:
                raise HFFolderError(f"{what}={self.path}: {exc}") from None
            for key, info in header.items():
                if key != "__metadata__":
                    out[key] = TensorInfo(file=path, dtype=info["dtype"], shape=tuple(info["shape"]))
        if (self.path / INDEX).is_file():
            self._check_index(weight_map, out, what)
        return out

    def _weight_map(self, what: str) -> dict[str, str]:
        """The index's ``weight_map`` (tensor name -> shard file name), refused when it is not one."""
        index = read_json_object(self.path / INDEX, error=HFFolderError)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise HFFolderError(
                f"{what}={self.path}: {INDEX} has no weight_map of tensor names to shard files (it has "
                f"{sorted(index)[:6]}); {COPY_AGAIN}"
            )
        return weight_map

    def _check_index(self, weight_map: dict[str, str], found: dict[str, TensorInfo], what: str) -> None:
        """The index and the shards agree: every tensor it maps is in the shard it names, and no shard in the
        folder is left out of it (an index from another save beside these shards)."""
        wrong = sorted(k for k, f in weight_map.items() if k not in found or found[k].file.name != f)
        if wrong:
            more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
            raise HFFolderError(
                f"{what}={self.path}: {INDEX} maps {', '.join(wrong[:3])}{more} to shards that do not hold them; "
                "the index and the shards are from different saves: copy the folder again"
            )
        listed = set(weight_map.values())
        unlisted = sorted(p.name for p in self.path.glob("*.safetensors") if p.name not in listed)
        if unlisted:
            raise HFFolderError(
                f"{what}={self.path}: {', '.join(unlisted)} is not in {INDEX}; a shard missing from the index "
                "(another save's file, or an incomplete index): remove it or copy the folder again"
            )

    def config(self) -> dict[str, Any]:
        return read_json_object(self.path / CONFIG, error=HFFolderError)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: info.shape for key, info in self.tensors.items()}

    def read(self, key: str, index: tuple[slice, ...]):
        """``tensor[index]`` of the stored tensor ``key``, reading only those bytes."""
        from safetensors import safe_open

        with safe_open(str(self.tensors[key].file), framework="pt") as f:
            return f.get_slice(key)[index]


def write_weights(out: Path, tensors: dict[str, Any], *, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards and their index when the tensors
    exceed ``max_shard_bytes``; returns the files written."""
    from safetensors.torch import save_file

    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards: list[dict[str, Any]] = [{}]
    filled = 0
    for key, tensor in tensors.items():
        if shards[-1] and filled + sizes[key] > max_shard_bytes:
            shards.append({})
            filled = 0
        shards[-1][key] = tensor.contiguous()
        filled += sizes[key]
    if len(shards) == 1:
        save_file(shards[0], str(out / WEIGHTS), metadata={"format": "pt"})
        return [WEIGHTS]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file(shard, str(out / name), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(sizes.values())},
        "weight_map": {k: name for name, shard in zip(names, shards) for k in shard},
    }
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, INDEX]
