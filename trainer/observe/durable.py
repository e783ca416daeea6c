"""Files a run writes and reads back, made to survive a crash mid-write.

A file that is rewritten (summary.json, status.json, requeues.json, wandb_run.json, a checkpoint's
marker, an attempt's exit record) goes through a temporary file in the same folder, fsync and
``os.replace``: a reader sees the old file or the new one, never half of one. A file that is appended to
(metrics.jsonl) or one cut short anyway (a copy interrupted, a full disk, a file edited by hand) is read up
to its last whole record: the whole records are kept and one warning names the file and the line where
the torn part starts. Nothing here raises on a torn file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("meshtrain.files")

#: (file, line) already warned about (line 0: the whole file): one warning per torn file and process
_warned: set[tuple[int, str, int]] = set()


def _clean(obj: Any) -> Any:
    """JSON-safe values: NaN/inf become null, numpy scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_line(record: dict[str, Any]) -> str:
    """One metrics.jsonl record, newline included."""
    return json.dumps(_clean(record)) + "\n"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file in the same folder, fsync and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from the other users of a shared folder
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """The rename itself survives a power cut once the folder is synced (best effort: not every filesystem can)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON (one top-level member per line, so a torn copy keeps the whole ones), atomically."""
    write_text(path, json.dumps(_clean(obj), indent=2, default=str) + "\n")


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8), atomically."""
    write_bytes_atomic(path, text.encode())


def warn_torn(path: Path, line: int | None, what: str) -> None:
    """One warning per file and line (or file, without a line) and process, however often it is read."""
    key = (os.getpid(), str(Path(path).resolve()), line or 0)  # a forked worker warns in its own log too
    if key in _warned:
        return
    _warned.add(key)
    where = f"{path} line {line}" if line else str(path)
    log.warning("warning: %s: %s", where, what)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _whole_members(text: str) -> tuple[Any, int]:
    """The whole members of a torn top-level object or array, and where the torn part starts.

    A member counts only when the delimiter after it (``,`` or the closing bracket) is there too: a number
    cut short (``2.3`` of ``2.345``) still parses, and must not be kept."""
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if pos >= len(text) or text[pos] not in "{[":
        return None, pos
    is_dict, close = text[pos] == "{", "}" if text[pos] == "{" else "]"
    out: Any = {} if is_dict else []
    pos += 1
    while True:
        start = pos = _skip_ws(text, pos)
        try:
            if is_dict:
                key, pos = decoder.raw_decode(text, pos)
                pos = _skip_ws(text, pos)
                if not isinstance(key, str) or text[pos : pos + 1] != ":":
                    return out, start
                pos = _skip_ws(text, pos + 1)
            value, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, IndexError):
            return out, start
        pos = _skip_ws(text, pos)
        if text[pos : pos + 1] not in (",", close):
            return out, start
        if is_dict:
            out[key] = value
        else:
            out.append(value)
        if text[pos] == close:
            return out, len(text)
        pos += 1


def read_json(path: Path, *, default: Any = None) -> Any:
    """A JSON file written by the run; a torn one gives its whole top-level members (one warning); a missing
    or unreadable one gives ``default``."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return default
    try:
        return json.loads(text)
    except ValueError:
        pass
    value, torn_at = _whole_members(text)
    kept = f"{len(value)} whole member(s) kept" if value else "nothing whole to keep"
    warn_torn(path, _line_of(text, torn_at), f"torn or truncated JSON ({len(text.encode())} bytes); {kept}")
    return default if value is None else value


def read_whole_json(path: Path) -> tuple[Any, str | None]:
    """A JSON file that is only usable whole (a checkpoint marker): ``(value, None)``, or ``(None, why)``
    naming the line where it is torn."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    try:
        return json.loads(text), None
    except ValueError:
        _, torn_at = _whole_members(text)
        return None, f"torn or truncated at line {_line_of(text, torn_at)} ({len(text.encode())} bytes)"


@dataclass
class JsonLines:
    """A JSON-lines file read record by record: each whole record with the byte offset just after it."""

    records: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # 1-based line of each record
    bad_lines: list[int] = field(default_factory=list)
    size: int = 0


def scan_jsonl(path: Path) -> JsonLines:
    """Every whole record of a JSON-lines file (an object per line); a torn line is skipped, with one warning
    naming the file and the first such line."""
    out = JsonLines()
    try:
        data = Path(path).read_bytes()
    except OSError:
        return out
    out.size = len(data)
    pos, number = 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        number += 1
        raw = data[pos:end].strip()
        if raw:
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if isinstance(record, dict):
                out.records.append(record)
                out.ends.append(end)
                out.lines.append(number)
            else:
                out.bad_lines.append(number)
        pos = end
    if out.bad_lines:
        first = out.bad_lines[0]
        tail = "the last line" if out.bad_lines == [number] else f"{len(out.bad_lines)} line(s)"
        warn_torn(
            path,
            first,
            f"torn record(s) skipped ({tail}); {len(out.records)} whole record(s) kept",
        )
    return out


def keep_records(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Cut a JSON-lines file back to its whole records that ``keep`` accepts, each ending in a newline (truncated in
    place when they are its first lines, else rewritten)."""
    scan = scan_jsonl(path)
    kept = [i for i, r in enumerate(scan.records) if keep(r)]
    # the kept records are the file's first lines, with nothing torn among them: truncate
    if kept == list(range(len(kept))) and (not kept or scan.lines[kept[-1]] == len(kept)):
        end = scan.ends[kept[-1]] if kept else 0
        with open(path, "r+b") as f:
            f.truncate(end)
            f.seek(max(end - 1, 0))
            if end and f.read(1) != b"\n":
                f.write(b"\n")  # a whole last record that lost only its newline
            f.flush()
            os.fsync(f.fileno())
        return
    write_text(path, "".join(json_line(scan.records[i]) for i in kept))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return scan_jsonl(path).records
