"""The layout's rules, read from the source and from git: imports run one way (models <- parallel <- trainer), no
tracked file points outside the repository, no binary or build artifact is tracked, links, paths and modules named
in the docs exist, README's architecture tree names every module, and tests are grouped by kind."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.import_watch import MODELLING_CODE, refuse_new_import
from tests.source_files import parsed, walked

#: package -> top-level packages it must never import (conf/ may be imported by all)
FORBIDDEN = {
    "models": {"parallel", "trainer"},
    "parallel": {"trainer"},
    "conf": {"trainer"},
}

#: strings that name a place outside this checkout; split so that this file does not match itself
OUTSIDE = [
    "/" + "work/",
    "../" + "shared",
    "STACK-" + "NOTES",
    "/" + "home/",
    "/" + "Users/",
]

#: suffixes of build outputs and binaries that must stay out of git (.gitignore covers them)
ARTIFACTS = (".whl", ".so", ".pyd", ".dylib", ".o", ".pyc", ".pyo", ".egg", ".tar.gz", ".tgz", ".zip", ".pt", ".pth")


def tracked_files() -> list[str]:
    try:
        proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    # a file deleted in the work tree but not yet staged is not part of the tree under test
    return [p for p in proc.stdout.split("\0") if p and (ROOT / p).exists()]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file, including those inside functions."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in walked(path, source):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_import_walker_sees_imports_inside_functions_and_relative_ones():
    """The walker itself: a function-local import and relative imports are all resolved to absolute names."""
    src = "from . import layout\nfrom ..plan import specs\n\ndef f():\n    import trainer.validate\n"
    got = imported_modules(ROOT / "parallel" / "core" / "probe.py", source=src)
    assert got == [(1, "parallel.core"), (2, "parallel.plan"), (5, "trainer.validate")], got


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package):
    files = python_files(package)
    assert files, f"no Python files under {package}/"
    bad = []
    for path in files:
        for line, name in imported_modules(path):
            top = name.split(".")[0]
            if top in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, f"{package}/ must not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(bad)


def module_graph(sources: dict[str, tuple[Path, str | None]]) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a.b import c`` imports ``a.b.c`` when that is a module),
    for ``sources``: module name -> (its path, its source or None to read the file)."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, (path, source) in sources.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in walked(path, source):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
                base = base if node.level else node.module or ""
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                parts = target.split(".")
                # the longest prefix that is a project module (a package's __init__ counts as a module)
                hit = next(
                    (".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in graph), None
                )
                if hit is not None and hit != name:
                    graph[name].add(hit)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def project_sources() -> dict[str, tuple[Path, str | None]]:
    return {module_name(p): (p, None) for package in PACKAGES for p in python_files(package)}


def test_circle_finder_catches_a_planted_circle():
    """The check itself: a circle closed by an import inside a function, one through ``from package import
    module``, and a module that imports itself (no circle) are told apart."""
    root = ROOT / "parallel"
    planted = {
        "parallel.a": (root / "a.py", "from parallel.b import f\n"),
        "parallel.b": (root / "b.py", "def f():\n    from parallel import c\n"),
        "parallel.c": (root / "c.py", "import parallel.a\n"),
        "parallel.d": (root / "d.py", "from . import a\nimport parallel.d\n"),
        "parallel": (root / "__init__.py", ""),
    }
    assert import_circles(module_graph(planted)) == [["parallel.a", "parallel.b", "parallel.c"]]
    planted["parallel.c"] = (root / "c.py", "import torch\n")
    assert import_circles(module_graph(planted)) == []


def test_no_import_circles():
    """No module of conf/, models/, parallel/ or trainer/ reaches itself through imports, those inside functions
    and under ``TYPE_CHECKING`` included: each technique, check and table is imported downward only."""
    circles = import_circles(module_graph(project_sources()))
    assert not circles, "import circles (move the shared piece down, or pass it in as an argument):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def folder_graph(graph: dict[str, set[str]], sources: dict[str, tuple[Path, str | None]]) -> dict[str, set[str]]:
    """folder -> the folders its modules import, from the module graph: a module's folder is the one its file
    lies in (``parallel/assembly``; a package's top-level modules are the package's folder, ``trainer``)."""

    def folder(name: str) -> str:
        return sources[name][0].parent.relative_to(ROOT).as_posix()

    out: dict[str, set[str]] = {folder(name): set() for name in graph}
    for name, targets in graph.items():
        out[folder(name)] |= {folder(t) for t in targets} - {folder(name)}
    return out


def test_folder_loop_finder_catches_a_planted_loop():
    """The check itself: two folders whose modules import each other's (no module circle among them) are a
    loop; a folder importing its own modules and a one-way import between folders are not."""
    root = ROOT / "parallel"
    planted = {
        "parallel.low.a": (root / "low" / "a.py", "import torch\n"),
        "parallel.low.b": (root / "low" / "b.py", "from parallel.low import a\n"),
        "parallel.high.c": (root / "high" / "c.py", "from parallel.low.b import f\n"),
        "parallel.high.d": (root / "high" / "d.py", "import parallel.high.c\n"),
        "parallel.high.e": (root / "high" / "e.py", "import torch\n"),
    }
    graph = module_graph(planted)
    assert import_circles(graph) == []
    assert import_circles(folder_graph(graph, planted)) == []
    # low/a.py now imports high/e.py, which imports nothing of low/: no module circle, but a folder loop
    planted["parallel.low.a"] = (root / "low" / "a.py", "def f():\n    from parallel.high import e\n")
    graph = module_graph(planted)
    assert import_circles(graph) == []
    assert import_circles(folder_graph(graph, planted)) == [["parallel/high", "parallel/low"]]


def test_no_folder_loops():
    """Imports between folders run one way too: ``parallel/foundation`` (what techniques and the pipeline stand
    on) <- ``parallel/techniques``, ``parallel/pipeline`` <- ``parallel/assembly`` (compose, the engines, the
    registry) <- ``parallel/strategies``; conf/ assembles the layers' schemas and none of them imports it back.
    A folder that holds two floors (a piece that folders below it use, beside one that uses them) shows here."""
    sources = project_sources()
    loops = import_circles(folder_graph(module_graph(sources), sources))
    assert not loops, "folders that import each other (move the piece the lower one needs down):\n" + "\n".join(
        " <-> ".join(c) for c in loops
    )


#: the longest a product function may be, in lines from its ``def`` to its last line (exclusive)
MAX_FUNCTION_LINES = 80


def long_functions(path: Path, source: str | None = None) -> list[str]:
    """``path:line name (n lines)`` for every function (methods and nested ones included) of ``MAX_FUNCTION_LINES``
    lines or more, counted as ``end_lineno - lineno``."""
    return [
        f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in walked(path, source)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno >= MAX_FUNCTION_LINES
    ]


def test_the_length_check_catches_a_planted_long_function():
    path = ROOT / "parallel" / "probe.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(path, source=f"def long():\n{body}\n") == [
        f"parallel/probe.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"
    ]
    short = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    assert (
        long_functions(path, source=f"class A:\n    def short(self):\n    {short.replace(chr(10), chr(10) + '    ')}\n")
        == []
    )


def test_no_product_function_of_80_lines_or_more():
    """A function of 80 lines or more does several things: split it by what each part does (the cost model's
    terms, an engine's summary parts)."""
    long = [hit for package in PACKAGES for path in python_files(package) for hit in long_functions(path)]
    assert not long, "functions of 80 lines or more (split them by what each part does):\n" + "\n".join(long)


#: docs/architecture.md: the folders lowest first, and the glossary of the words in class names
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"
#: the words of the glossary: a product class whose name ends in one must be in its row
GLOSSARY_WORDS = ("Spec", "Settings", "Engine", "Meter", "Shape")


def test_the_architecture_doc_lists_folders_lowest_first():
    """Every folder of the product is in docs/architecture.md's list, and imports only folders listed before it
    (the families' row may import itself: one family builds on another's)."""
    import fnmatch

    block = ARCHITECTURE_DOC.read_text().split("```")[1]
    order = [line.split()[0].rstrip("/").replace("<family>", "*") for line in block.splitlines() if line.strip()]

    def place(folder: str) -> int | None:
        return next((i for i, pattern in enumerate(order) if fnmatch.fnmatch(folder, pattern)), None)

    sources = project_sources()
    bad = []
    for folder, targets in sorted(folder_graph(module_graph(sources), sources).items()):
        i = place(folder)
        if i is None:
            bad.append(f"{folder}/ is not listed")
            continue
        for target in sorted(targets):
            j = place(target)
            if j is None or j > i or (j == i and "*" not in order[i]):
                bad.append(f"{folder}/ imports {target}/, listed after it")
    assert not bad, "docs/architecture.md's folder list (lowest first) does not match the imports:\n" + "\n".join(bad)


def test_the_glossary_names_every_class_of_its_words():
    """A class named ``...Spec``, ``...Settings``, ``...Engine``, ``...Meter`` or ``...Shape`` is in the glossary of
    docs/architecture.md, so the words keep the meaning it gives them."""
    glossary = ARCHITECTURE_DOC.read_text().split("## Glossary", 1)[1].split("\n## ", 1)[0]
    missing = []
    for package in PACKAGES:
        for path in python_files(package):
            for node in parsed(path).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith(GLOSSARY_WORDS):
                    if f"`{node.name}`" not in glossary:
                        missing.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not missing, (
        "classes whose names use a glossary word but are not in it (docs/architecture.md):\n" + "\n".join(missing)
    )


#: a string that names a module or object by import path: ``package.module``, ``package.module:attr``
IMPORT_PATH = re.compile(r"^([A-Za-z_]\w*)(\.\w+)+(:[\w.]+)?$")


def named_import_paths(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, string) for every string constant in the file that is an import path (a ``_target_``, a
    ``"module:function"``): imports the import statements do not show."""
    return [
        (node.lineno, node.value)
        for node in walked(path, source)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and IMPORT_PATH.match(node.value)
    ]


def test_named_import_path_walker_sees_targets():
    src = 'X = "parallel.plan.specs.refuse_to_build"\nY = "models.gpt.parallelize:parallelize_gpt"\nZ = "a b. c"\n'
    got = named_import_paths(ROOT / "models" / "probe.py", source=src)
    assert got == [(1, "parallel.plan.specs.refuse_to_build"), (2, "models.gpt.parallelize:parallelize_gpt")], got


@pytest.mark.parametrize("package", ["models", "parallel"])
def test_import_paths_named_in_strings_run_one_way(package):
    """``_target_: "parallel.x.f"`` in models/ (or in a model's YAML) imports parallel/ at run time as surely as an
    import statement does. (conf/ is left out: its schemas name the trainer's data classes by design.)"""
    bad = []
    for path in python_files(package):
        for line, name in named_import_paths(path):
            if name.split(".")[0] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} names {name}")
    if package == "models":
        for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                key, _, value = line.partition(":")
                if key.strip() in ("_target_", "spec") and value.strip().split(".")[0] in FORBIDDEN[package]:
                    bad.append(f"{path.relative_to(ROOT)}:{n} names {value.strip()}")
    assert not bad, f"{package}/ must not name {sorted(FORBIDDEN[package])} in import paths either:\n" + "\n".join(bad)


def test_no_tracked_file_points_outside_the_repository():
    bad = []
    for rel in tracked_files():
        try:
            text = (ROOT / rel).read_text()
        except UnicodeDecodeError:
            continue  # binaries are refused by the next test
        for n, line in enumerate(text.splitlines(), start=1):
            for needle in OUTSIDE:
                if needle in line:
                    bad.append(f"{rel}:{n}: {needle!r} in {line.strip()[:100]!r}")
    assert not bad, "paths outside the repository (put the fact in docs/, e.g. docs/stack.md):\n" + "\n".join(bad)


def test_no_binary_or_build_artifact_is_tracked():
    files = tracked_files()
    bad = [p for p in files if p.endswith(ARTIFACTS) or "__pycache__/" in p or ".egg-info/" in p]
    assert not bad, f"tracked build artifacts (remove them with git rm; .gitignore covers them): {bad}"


def test_gitignore_covers_what_the_tools_write():
    ignored = {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()}
    wanted = [
        ".venv/",
        ".venv",  # a .venv symlink too (git does not match a link with .venv/): one was committed by mistake once
        "__pycache__/",
        "outputs/",
        "multirun/",
        "wandb/",
        ".pytest_cache/",
        ".ruff_cache/",
        ".hypothesis/",
        "*.egg-info/",
        "/build/",
        "dist/",
    ]
    assert not [w for w in wanted if w not in ignored], [w for w in wanted if w not in ignored]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_in_the_docs_resolve():
    bad = []
    for rel in tracked_files():
        if not rel.endswith(".md"):
            continue
        doc = ROOT / rel
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT not in path.parents:
                bad.append(f"{rel}: ({target})")
    assert not bad, "links to files that are not in the repository:\n" + "\n".join(bad)


#: the packages whose modules README's architecture tree must name, one line per package
PACKAGES = ("conf", "models", "parallel", "trainer")


def architecture_blocks() -> list[dict[str, str]]:
    """README's "## Architecture" code blocks as {first column: rest of the line}."""
    text = (ROOT / "README.md").read_text()
    assert "\n## Architecture\n" in text, "README.md has no '## Architecture' section"
    section = text.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    out = []
    for block in blocks:
        rows = {}
        for line in block.splitlines()[1:]:  # the first line is the fence's language tag
            if line.strip():
                loc, _, rest = line.partition(" ")
                rows[loc] = rest
        out.append(rows)
    return out


#: README's one row for every model family's folder (the families are the registry's, not listed in README)
FAMILY_ROW = "models/<family>/"


def family_folders() -> list[str]:
    """``models/<family>/`` of each registered family whose builder lives in models/ (from the registry)."""
    from models.registry import REGISTRY

    parts = [spec.builder.split(".") for spec in REGISTRY.values()]
    return sorted({f"models/{p[1]}/" for p in parts if p[0] == "models" and len(p) > 3})


def test_readme_architecture_matches_the_tree():
    tree, *rest = architecture_blocks()
    families = family_folders()
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            folder = rel.rsplit("/", 1)[0] + "/"
            row = tree.get(FAMILY_ROW if folder in families else folder, "")
            named = re.search(rf"(?<![\w/.]){re.escape(path.name)}\b", row)
            if path.name != "__init__.py" and rel not in tree and not named:
                missing.append(rel)
    stale = []
    for loc, text in tree.items():
        folders = families if loc == FAMILY_ROW else [loc]
        if not all((ROOT / f).exists() for f in folders):
            stale.append(loc)
        elif loc.endswith("/"):
            names = re.findall(r"(?<![\w/.])(\w+\.py)\b", text)
            stale += [loc + n for n in names if not any((ROOT / f / n).exists() for f in folders)]
    assert not missing, (
        f"modules README.md's architecture tree does not name (add them to their package's line): {missing}"
    )
    assert not stale, f"README.md's architecture tree names what is not in the tree: {stale}"
    assert rest, "README.md's architecture section has no step path block"
    step_path = list(rest[0])
    assert step_path[0] == "train.py" and step_path[-1] == "trainer/observe/sinks.py", step_path
    assert "trainer/loop/fit.py" in step_path and "parallel/assembly/compose.py" in step_path, step_path
    assert all((ROOT / p).is_file() for p in step_path), step_path


#: a path into the repository as docs write it: `parallel/assembly/pipeline_engine.py`, `conf/topology/local_cpu.yaml`
PATH = re.compile(r"(?<![\w./~-])((?:\.ci|conf|models|parallel|trainer|tests|benchmarks|docs)/[\w./-]*)")
#: a module as docs write it: `parallel.assembly.strategy.Strategy`, `python -m trainer.report`
DOTTED = re.compile(r"(?<![\w./])((?:conf|models|parallel|trainer|benchmarks)(?:\.\w+)+)")


def test_paths_and_modules_named_in_docs_and_configs_exist():
    bad = []
    for rel in tracked_files():
        if not rel.endswith((".md", ".yaml", ".toml")) and rel not in ("Makefile", ".ci/run"):
            continue
        text = (ROOT / rel).read_text()
        for m in PATH.finditer(text):
            path = m.group(1).rstrip(".")
            if text[m.end() : m.end() + 1] in "*<{|" and m.end() < len(text):
                continue  # a pattern (conf/parallel/*.yaml, multirun/<date>), not a path
            if not (ROOT / path).exists():
                bad.append(f"{rel}: {path}")
            test = re.match(r"::(\w+)", text[m.end() :])  # tests/x/test_y.py::test_name
            if test and (ROOT / path).is_file() and f"def {test.group(1)}(" not in (ROOT / path).read_text():
                bad.append(f"{rel}: {path}::{test.group(1)}")
        for m in DOTTED.finditer(text):
            parts = m.group(1).split(".")
            # the longest prefix that is a module or package here; shorter than two parts: a config key
            n = max((k for k in range(1, len(parts) + 1) if module_file(parts[:k])), default=0)
            if n < 2 or n == len(parts):
                continue
            source = module_file(parts[:n]).read_text()
            if not re.search(rf"^\s*(?:def|class)\s+{parts[n]}\b|^{parts[n]}\s*[:=]", source, re.M):
                bad.append(f"{rel}: {m.group(1)} ({parts[n]} is not defined in {'.'.join(parts[:n])})")
    assert not bad, "docs and configs name paths or modules that are not in the repository:\n" + "\n".join(bad)


def module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _marked_slow(node: ast.AST) -> bool:
    return any("slow" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def _defined_functions(body: list[ast.AST]) -> list[ast.FunctionDef]:
    """Every ``def`` in these statements, nested ones included: what ``ast.walk`` finds, walking statements only (a
    ``def`` is a statement, and no expression holds one)."""
    found = []
    for node in body:
        if isinstance(node, ast.FunctionDef):
            found.append(node)
        for _, value in ast.iter_fields(node):
            if isinstance(value, list):
                blocks = [v for v in value if isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case))]
                found += _defined_functions(blocks)
    return found


#: what starts a Python interpreter (``python train.py``, ``python -m ...``, ``python -c``, ``make train``)
STARTS_PYTHON = re.compile(r"\bsys\.executable\b|\b(?:run_train|make_train|refused_before_torch)\(")


def test_tests_are_grouped_by_kind():
    """tests/unit (the fast tier) and tests/system (in process but heavy: full-size planner searches, the config-space
    property test, every test that builds or loads a transformers model, since importing transformers' modelling
    code costs each interpreter 3.2-3.6 s of CPU, README's Tests; tests/unit/conftest.py fails a unit test that
    imports it): no Python process started, never marked slow; tests/integration: start workers or processes, every
    test marked slow."""
    loose = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert not loose, (
        f"put these in tests/unit or tests/system (in-process) or tests/integration (start workers): {loose}"
    )
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), f"test file names must not repeat: {sorted(names)}"
    bad = []
    for kind in ("unit", "system", "integration"):
        for path in sorted((ROOT / "tests" / kind).glob("test_*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            module_slow = any(
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
                and "slow" in ast.unparse(n.value)
                for n in tree.body
            )
            tests = [n for n in _defined_functions(tree.body) if n.name.startswith("test_")]
            slow = [n.name for n in tests if module_slow or _marked_slow(n)]
            if kind != "integration" and slow:
                bad.append(
                    f"tests/{kind}/{path.name}: marked slow (starts workers? move it to tests/integration): {slow}"
                )
            starts = sorted(set(STARTS_PYTHON.findall(source)))
            if kind != "integration" and starts:
                bad.append(
                    f"tests/{kind}/{path.name}: starts a Python process ({starts}): move it to tests/integration"
                )
            if kind == "integration" and len(slow) != len(tests):
                fast = sorted({n.name for n in tests} - set(slow))
                bad.append(
                    f"tests/integration/{path.name}: not marked slow (in-process? move to tests/unit or tests/system): {fast}"
                )
    assert not bad, "\n".join(bad)


def test_the_fast_tier_fails_a_test_that_loads_transformers_modelling_code(monkeypatch):
    """tests/unit/conftest.py's check, on a module name no test imports (importing the real one here would cost this
    worker the 3.6 s the check keeps out): silent while it is not imported or was before the test, fails the test
    that imported it, with the fix."""
    assert MODELLING_CODE == "transformers.modeling_utils"
    name = "meshtrain_test_never_imported"
    refuse_new_import(name, loaded_before=False)
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    refuse_new_import(name, loaded_before=True)
    with pytest.raises(pytest.fail.Exception, match=r"loads transformers' modelling code .*move it to tests/system"):
        refuse_new_import(name, loaded_before=False)
