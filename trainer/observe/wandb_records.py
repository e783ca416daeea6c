"""Read back an offline W&B run (``run-<id>.wandb``) without a server.

wandb 0.31 no longer ships an offline reader, so this reads the record log directly: a 7-byte header
(``:W&B``, magic 0xBEE1, version 0) then 32 KiB blocks of chunks, each with a 7-byte header (CRC-32
of type byte + data, length, type FULL/FIRST/MIDDLE/LAST), the LevelDB log layout. Each assembled
record is a ``wandb.proto.wandb_internal_pb2.Record`` protobuf. Used by tests and reports.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class RecordLogError(ValueError):
    pass


def iter_record_bytes(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    if len(data) < HEADER or data[:4] != b":W&B":
        raise RecordLogError(f"{path}: not a W&B record log (bad header)")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        space = BLOCK - pos % BLOCK
        if space < HEADER:  # block trailer padding
            pos += space
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:  # zero padding at the end of a block
            pos += space
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        if len(chunk) < length:
            break  # truncated tail: the writer was still running
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise RecordLogError(f"{path}: checksum mismatch at byte {pos}")
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    run_id: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def _value(item) -> Any:
    return json.loads(item.value_json)


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(path: Path) -> OfflineRun:
    """Config, history rows, summary and run metadata of one ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun()
    for raw in iter_record_bytes(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.group, run.job_type, run.tags = r.run_id, r.run_group, r.job_type, list(r.tags)
            for item in r.config.update:
                run.config[_key(item)] = _value(item)
        elif kind == "config":
            for item in rec.config.update:
                run.config[_key(item)] = _value(item)
        elif kind == "history":
            run.history.append({_key(item): _value(item) for item in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                run.summary[_key(item)] = _value(item)
        elif kind == "files":
            run.files.extend(f.path for f in rec.files.files)
    # W&B stores config values as {"value": v}
    run.config = {k: (v["value"] if isinstance(v, dict) and "value" in v else v) for k, v in run.config.items()}
    return run


def find_run_file(run_dir: Path) -> Path:
    files = sorted(Path(run_dir).glob("wandb/*run-*/run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no W&B run file under {run_dir}/wandb")
    return files[-1]
