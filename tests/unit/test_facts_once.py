"""Each fact is defined once and imported: no second table of the strategy, schedule, split-policy, precision,
activation-checkpointing or family names in the product sources, no spec that retypes its family name or builder
path, and one rank memory budget. Read from the source with ``ast``: a second definition fails here before it drifts from the first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.source_files import parsed, walked

#: the product packages scanned
PACKAGES = ("conf", "models", "parallel", "trainer")


def canonical_tables() -> dict[str, tuple[str, frozenset[str]]]:
    """What each table of names holds and the one file that defines it."""
    from models.registry import REGISTRY
    from parallel.assembly.registry import STRATEGIES
    from parallel.foundation.checkpointing_modes import AC_MODES
    from parallel.foundation.precision import PLANNER_PRECISIONS, PRECISIONS
    from parallel.pipeline.schedules import SCHEDULES
    from parallel.pipeline.split import POLICIES

    return {
        "strategy names": ("parallel/assembly/registry.py", frozenset(STRATEGIES)),
        "schedule names": ("parallel/pipeline/schedules.py", frozenset(SCHEDULES)),
        "split policies": ("parallel/pipeline/split.py", frozenset(POLICIES)),
        "trainer precisions": ("parallel/foundation/precision.py", frozenset(PRECISIONS)),
        "planner precisions": ("parallel/foundation/precision.py", frozenset(PLANNER_PRECISIONS)),
        "activation-checkpointing modes": ("parallel/foundation/checkpointing_modes.py", frozenset(AC_MODES)),
        "model families": ("models/registry.py", frozenset(REGISTRY)),
    }


def literal_names(node: ast.AST) -> frozenset[str] | None:
    """The strings a literal tuple / list / set holds, or a literal dict's string keys; None for anything else."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    else:
        return None
    names = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return frozenset(names) if names and len(names) == len(items) else None


def module_level_tables(path: Path, source: str | None = None) -> list[tuple[int, str, frozenset[str]]]:
    """(line, assigned name, names) for every module-level assignment of a literal table of names."""
    out = []
    for node in parsed(path, source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = literal_names(value)
        if names is not None:
            label = ", ".join(t.id for t in targets if isinstance(t, ast.Name))
            out.append((node.lineno, label, names))
    return out


def product_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_scanner_sees_a_retyped_table():
    src = 'X = ("fp32", "bf16-mixed", "bf16")\nY: dict = {"fp32": 1, "mixed": 2}\nZ = tuple(A)\n\ndef f():\n    W = ("a",)\n'
    got = module_level_tables(ROOT / "conf" / "probe.py", source=src)
    assert got == [(1, "X", frozenset({"fp32", "bf16-mixed", "bf16"})), (2, "Y", frozenset({"fp32", "mixed"}))], got


@pytest.mark.parametrize("fact", sorted(canonical_tables()))
def test_a_table_of_names_is_defined_once(fact):
    home, names = canonical_tables()[fact]
    seen = []
    for path in product_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, label, found in module_level_tables(path):
            if found == names:
                seen.append(f"{rel}:{line} {label}")
    elsewhere = [s for s in seen if not s.startswith(home + ":")]
    assert not elsewhere, f"the {fact} are retyped outside {home}; import them from there instead:\n" + "\n".join(
        elsewhere
    )


def test_specs_take_family_and_builder_from_their_config():
    """``ModelSpec(family="gpt", builder="models.gpt.model.GPT")`` would repeat the config's ``family`` and
    ``_target_``: a spec derives them (``family=GPTConfig.family, builder=GPTConfig._target_``)."""
    bad = []
    for path in sorted((ROOT / "models").glob("*/spec.py")):
        for node in walked(path):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg in ("family", "builder") and isinstance(kw.value, ast.Constant):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {kw.arg}={kw.value.value!r}")
    assert not bad, "family names / builder paths retyped in a spec (derive them from the config):\n" + "\n".join(bad)


def test_every_registered_spec_agrees_with_its_config():
    from models.registry import REGISTRY

    for family, spec in REGISTRY.items():
        if spec.config is not None:
            assert (spec.config.family, spec.config._target_) == (family, spec.builder), family


def _attrs(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def test_the_rank_memory_budget_is_computed_once():
    """device_memory_gb x memory_fraction lives in parallel/foundation/memory.py's rank_budget_bytes."""
    home = "parallel/foundation/memory.py"
    bad = []
    for path in product_files():
        rel = path.relative_to(ROOT).as_posix()
        for node in walked(path):
            if isinstance(node, ast.BinOp) and {"device_memory_gb", "memory_fraction"} <= _attrs(node):
                if rel != home:
                    bad.append(f"{rel}:{node.lineno}")
    assert not bad, f"the rank budget is computed outside {home} (call rank_budget_bytes):\n" + "\n".join(bad)
