"""The command line as a shell user types it, made into overrides Hydra's grammar reads.

bash expands ``~`` only at the start of a word or after the ``=`` of a variable assignment, and
``model.init_from=~/models/Qwen3-0.6B`` is neither (the dot makes it no variable name): the ``~`` reaches the
program, where Hydra's override grammar refuses it (``LexerNoViableAltException``). ``shell_expanded`` expands it
as the shell would have in a path, before Hydra parses the command line: ``~`` and ``~/...`` to ``$HOME``,
``~user/...`` to that user's home, at the start of a value and of each comma-separated sweep value. A ``~`` that
starts a key (``~model.lora``: Hydra's delete) is left alone, as is an unknown ``~user`` (Hydra then names it).
``train.py``, the ``meshtrain`` command and ``python -m parallel.plan`` call it on their arguments.
"""

from __future__ import annotations

import os

#: characters of Hydra's grammar that make a value more than a plain word: such values are left as written
STRUCTURED = set("[]{}()'\"$\\")


def _expand(word: str) -> str:
    """``word`` with a leading ``~`` or ``~user`` expanded, as a shell would; unchanged when it cannot be."""
    if not word.startswith("~"):
        return word
    expanded = os.path.expanduser(word)
    return word if expanded.startswith("~") else expanded


def expand_value(value: str) -> str:
    """One override's value with each leading ``~`` expanded (every element of a plain ``a,b`` sweep)."""
    if "~" not in value or STRUCTURED & set(value):
        return value
    return ",".join(_expand(part) for part in value.split(","))


def shell_expanded(args: list[str]) -> list[str]:
    """The arguments with ``~`` expanded in each ``key=value`` (and ``--flag=value``) as a shell expands a path."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        out.append(f"{key}={expand_value(value)}" if sep and key and not key.startswith("~") else arg)
    return out
