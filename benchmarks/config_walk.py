"""The walk: follow the composed config from ``trainer/task.py:run_task`` through the modules it visits, as a reader
new to the tree would, and count the rooms (modules) it enters and its returns to a room it had already left.

``python benchmarks/config_walk.py [ROOT] [--path]``, read from the source with ``ast`` (nothing is imported):

- the walk starts in ``run_task`` with its ``cfg`` argument marked as the config;
- in a function, a name is the config's when it is assigned from an expression that reads a config name (a section,
  a value, a typed object made from it: ``run = run_spec(cfg, layout)`` carries it on);
- a call is followed when an argument (or the object a method is called on: ``cfg.get``'s callee is not project
  code) reads a config name and the callee is project code found statically: a function of the module, one imported
  by name (inside functions too), ``module.function``, ``Class(...)`` (its ``__init__``), ``self.method``; the
  parameters that receive config names are the config's in the callee;
- depth first, in source order, each function once; a call into a function of another module moves to that room.

A return is a call into a room the walk had entered before (and left since): the reader opens a file again. Coming
back to the caller after a callee is not one: the reader only reads on where they were. ``--path`` prints the rooms
in the order the calls enter them; ``--calls`` prints each entering call (caller -> callee, a return marked ``R``)
and the rooms entered more than once.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("conf", "models", "parallel", "trainer")
START = ("trainer.task", "run_task", "cfg")


@dataclass
class Module:
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    """``f`` and ``Class.method``."""
    classes: set[str] = field(default_factory=set)


def parse(path: Path) -> ast.Module:
    """The syntax tree of one file, read-only here (tests/unit/test_config_walk.py gives the test process's trees,
    parsed once with the structure checks')."""
    return ast.parse(path.read_text())


def load(root: Path) -> dict[str, Module]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mod = Module(".".join(parts), parse(path))
            for node in mod.tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    mod.functions[node.name] = node
                elif isinstance(node, ast.ClassDef):
                    mod.classes.add(node.name)
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            mod.functions[f"{node.name}.{item.name}"] = item
            modules[mod.name] = mod
    return modules


def imports(mod: Module, fn: ast.AST) -> dict[str, tuple[str, str | None]]:
    """local name -> (module, attribute or None for a module), from the module's and the function's imports."""
    out: dict[str, tuple[str, str | None]] = {}
    package = mod.name.rsplit(".", 1)[0]
    for node in [*mod.tree.body, *ast.walk(fn)]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            for alias in node.names:
                out[alias.asname or alias.name] = (base, alias.name)
    return out


def reads(node: ast.AST, marked: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in marked for n in ast.walk(node))


class Walk:
    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.done: set[tuple[str, str]] = set()
        self.path: list[str] = []
        self.calls: list[tuple[str, str]] = []
        """(caller, callee) as ``module.function``, one per room entered after the first: ``path[i + 1]``'s call."""
        self.reading: list[str] = []

    def resolve(self, mod: Module, cls: str | None, call: ast.Call, names: dict) -> tuple[str, str] | None:
        f = call.func
        if isinstance(f, ast.Name):
            if f.id in mod.functions:
                return mod.name, f.id
            if f.id in mod.classes:
                return mod.name, f"{f.id}.__init__"
            if f.id in names:
                module, attr = names[f.id]
                if attr is not None and module in self.modules:
                    target = self.modules[module]
                    if attr in target.functions:
                        return module, attr
                    if attr in target.classes:
                        return module, f"{attr}.__init__"
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            owner = f.value.id
            if owner == "self" and cls is not None:
                return mod.name, f"{cls}.{f.attr}"
            if owner in mod.classes:
                return mod.name, f"{owner}.{f.attr}"
            if owner in names:
                module, attr = names[owner]
                full = module if attr is None else f"{module}.{attr}"
                if full in self.modules and f.attr in self.modules[full].functions:
                    return full, f.attr
        return None

    def visit(self, module: str, qualname: str, marked: set[str]) -> None:
        if (module, qualname) in self.done or qualname not in self.modules[module].functions:
            return
        self.done.add((module, qualname))
        self.reading.append(f"{module}.{qualname}")
        mod, fn = self.modules[module], self.modules[module].functions[qualname]
        cls = qualname.split(".")[0] if "." in qualname else None
        names = imports(mod, fn)
        marked = set(marked)
        for node in self.ordered(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                if reads(node.value, marked):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    marked |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Call):
                self.call(mod, cls, node, names, marked)
        self.reading.pop()

    def ordered(self, fn: ast.AST) -> list[ast.AST]:
        """Statements and calls in source order (an assignment after the calls on its right-hand side)."""
        found = [n for n in ast.walk(fn) if isinstance(n, (ast.Call, ast.Assign, ast.AnnAssign, ast.AugAssign))]
        return sorted(found, key=lambda n: (n.lineno, n.col_offset, isinstance(n, ast.Call)))

    def call(self, mod: Module, cls: str | None, node: ast.Call, names: dict, marked: set[str]) -> None:
        args = [*node.args, *(k.value for k in node.keywords)]
        if not any(reads(a, marked) for a in args):
            return
        target = self.resolve(mod, cls, node, names)
        if target is None or target[1] not in self.modules[target[0]].functions:
            return
        callee = self.modules[target[0]].functions[target[1]]
        params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        got = {p for p, a in zip(params, node.args) if reads(a, marked)}
        got |= {k.arg for k in node.keywords if k.arg and reads(k.value, marked)}
        if target in self.done:
            return
        if target[0] != mod.name:
            self.path.append(target[0])
            self.calls.append((self.reading[-1], f"{target[0]}.{target[1]}"))
        self.visit(*target, got)


def walked(root: Path) -> Walk:
    w = Walk(load(root))
    module, function, arg = START
    w.path.append(module)
    w.visit(module, function, {arg})
    return w


def walk(root: Path) -> list[str]:
    return walked(root).path


def returns(path: list[str]) -> int:
    """Calls into a room entered before."""
    seen: set[str] = set()
    count = 0
    for room in path:
        count += room in seen
        seen.add(room)
    return count


def call_lines(w: Walk) -> list[str]:
    """Each call that enters a room (``R``: a return), then the rooms entered more than once, most often first."""
    seen = {w.path[0]}
    lines = []
    for room, (caller, callee) in zip(w.path[1:], w.calls, strict=True):
        lines.append(f"{'R' if room in seen else ' '} {caller} -> {callee}")
        seen.add(room)
    counts = Counter(w.path)
    lines += [f"{n} x {room}" for room, n in counts.most_common() if n > 1]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--path", action="store_true", help="print the rooms in the order walked")
    parser.add_argument("--calls", action="store_true", help="print each entering call and the rooms entered again")
    args = parser.parse_args(argv)
    w = walked(Path(args.root))
    path = w.path
    if args.path:
        print("\n".join(path))
    if args.calls:
        print("\n".join(call_lines(w)))
    print(f"rooms {len(set(path))}, returns {returns(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
