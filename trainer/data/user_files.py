"""Reading the files of a user's folder (a model folder's JSON files, a tokenizer), so that a damaged one is refused
with its name and the fix, never a traceback. The caller names the error class its command maps to exit code 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the fix for a file of a user's folder that is damaged or cut short
COPY_AGAIN = "the file is damaged or its copy incomplete: copy or download the folder again"


def read_json_object(path: Path, *, error: type[ValueError], fix: str = COPY_AGAIN) -> dict[str, Any]:
    """The JSON object a file of a user's folder holds (config.json, an index, a tokenizer's configs). A file that
    is empty, cut short, not JSON, not UTF-8 or not an object is refused with ``error``, naming the file."""
    try:
        value = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        what = "empty" if not Path(path).stat().st_size else f"not valid JSON ({exc})"
        raise error(f"{path}: {what}; {fix}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: holds a JSON {type(value).__name__}, not the object (a {{...}} mapping) it should; {fix}")
    return value


def read_tokenizer(path: Path, *, error: type[ValueError]):
    """The ``tokenizers.Tokenizer`` of a tokenizer.json; a file it cannot load is refused with ``error``, naming it."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions for every malformed file
        raise error(f"{path}: not a tokenizer the tokenizers library loads ({exc}); {COPY_AGAIN}") from None


def text_lines(path: Path) -> Iterator[tuple[str, str | None]]:
    """(``file:line``, the line) of each non-blank line of a JSON-lines file; a line that is not UTF-8 comes as
    (``file:line``, None), for the reader to list among its problems by file and line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield f"{path}:{number}", None
                continue
            if line.strip():
                yield f"{path}:{number}", line


#: what a reader says of a line ``text_lines`` gives as None
NOT_UTF8 = "not UTF-8 text; save the file as UTF-8"
