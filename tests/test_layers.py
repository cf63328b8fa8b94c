"""maxinstr's import layers (docs/architecture.md, "Layers"): every module under src/maxinstr imports
only from a lower layer, renderers only from the base and analyze/, nobody imports another
module's private names, nothing below the CLI takes a name from the package root, and no two
modules import each other (directly or round a longer loop, inside a package too). Checked on
the source with `ast`, so imports inside functions and under `if TYPE_CHECKING:` count as much
as those at the top of a module."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.graphs import cycles

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "maxinstr"
DOC = ROOT / "docs" / "architecture.md"

# The layer table, bottom to top: the one place it is written down (docs/architecture.md draws it,
# and test_the_doc_draws_this_table holds the drawing to this). A unit is a subpackage of maxinstr
# or "base" (the top-level modules every layer uses); the package's own __init__.py and
# __main__.py (the entry points) count as cli's.
LAYERS: list[tuple[str, ...]] = [
    ("base",),                  # L0
    ("integrations",),           # L1
    ("rundir",),                 # L2: every file format of a run directory, the collectors' included
    ("kernels", "sample"),       # L3: the two collectors, peers
    ("record", "traces"),        # L4
    ("attribute",),              # L5
    ("analyze",),                # L6
    ("render", "launch"),        # L7
    ("cli",),                    # L8
]
# The top-level modules of maxinstr that make up "base" (they may import one another); _native and
# _columns are built from csrc/.
BASE = {"config", "errors", "columns", "warmup", "_columns", "_native", "_attrs", "_text", "_units", "_files", "_threads", "_version"}
# Units that may import only the base and the units named (beyond the layer rule).
ONLY_FROM = {"render": {"analyze"}}

# Imports that break a rule and live in files other work is changing now (issue 31); each is
# allowed exactly, with why. A key is (the importing module, what it imports): for a layer or
# privacy rule the module and name imported (maxinstr.rundir.load), for an import loop the
# module imported (the edge of the loop left out, so the rest of the graph is still checked).
# test_allowances_are_still_needed fails once one is gone, so this list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}

LAYER_OF = {unit: n for n, units in enumerate(LAYERS) for unit in units}
ROOT_INIT = SRC / "__init__.py"


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    module: str  # the module importing, dotted (maxinstr.traces.nsys)
    target: str  # the module imported, dotted (maxinstr.attribute.intervals)
    name: str | None  # the name taken from it (`from target import name`), None for `import target`

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(module: str) -> bool:
    return (SRC.parent / module.replace(".", "/") / "__init__.py").exists()


def is_module(module: str) -> bool:
    if module in {f"maxinstr.{name}" for name in BASE}:
        return True
    base = SRC.parent / module.replace(".", "/")
    return is_package(module) or base.with_suffix(".py").exists() or base.with_suffix(".pyi").exists()


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "cli"
    if parts[1] in BASE:
        return "base"
    if parts[1] in LAYER_OF:
        return parts[1]
    raise AssertionError(f"{module}: in no layer of tests/test_layers.py's LAYERS (add its package there and to docs/architecture.md)")


def _import_module_target(call: ast.Call) -> str | None:
    """The module an `importlib.import_module("maxinstr....")` call names, as far as its text
    says: a literal, or the literal prefix of an f-string up to its last dot."""
    func = call.func
    named = isinstance(func, ast.Attribute) and func.attr == "import_module" or isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}
    if not named or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        text = str(arg.values[0].value).rsplit(".", 1)[0]
    else:
        return None
    return text if text == "maxinstr" or text.startswith("maxinstr.") else None


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """Every import of a maxinstr module in one file (its text, or `source` in its place),
    wherever it sits in the file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    found: list[Import] = []
    binds_root = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "maxinstr" and not target.startswith("maxinstr."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if is_module(sub):  # `from package import submodule`: an import of the submodule
                    found.append(Import(path, node.lineno, module, sub, None))
                else:
                    found.append(Import(path, node.lineno, module, target, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "maxinstr":
                    binds_root = True  # resolved below, by what the file reads from it
                elif alias.name.startswith("maxinstr."):
                    found.append(Import(path, node.lineno, module, alias.name, None))
        elif isinstance(node, ast.Call):
            target = _import_module_target(node)
            if target is not None:
                found.append(Import(path, node.lineno, module, target, None))
    if binds_root:
        # `import maxinstr` then `maxinstr.x`: an import of submodule x, or of name x of the root
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "maxinstr":
                sub = f"maxinstr.{node.attr}"
                if is_module(sub):
                    found.append(Import(path, node.lineno, module, sub, None))
                else:
                    found.append(Import(path, node.lineno, module, "maxinstr", node.attr))
    return found


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(imp: Import) -> list[str]:
    """Which rules one import breaks (none: an empty list)."""
    broken: list[str] = []
    here, there = unit_of(imp.module), unit_of(imp.target)
    what = imp.target + (f".{imp.name}" if imp.name else "")
    if here != there:
        up, down = LAYER_OF[here], LAYER_OF[there]
        if down > up:
            broken.append(f"layers: {here} (L{up}) imports {what} from {there} (L{down}), a layer above it")
        elif down == up:
            broken.append(f"layers: {here} imports {what} from {there}, a package of its own layer (L{up})")
        elif here in ONLY_FROM and there != "base" and there not in ONLY_FROM[here]:
            allowed = ", ".join(["the base", *sorted(ONLY_FROM[here])])
            broken.append(f"layers: {here} imports {what} from {there}; {here} imports only {allowed}")
    # the package root is the users' front door (and the CLI's): a name defined there, or one it
    # re-exports lazily, is taken from its own module by everything below the CLI
    if imp.target == "maxinstr" and imp.name is not None and here != "cli":
        broken.append(f"package root: {imp.module} takes {imp.name} from maxinstr/__init__.py; import it from its own module")
    # a private module of a package (maxinstr.traces._util) belongs to that package; the
    # top-level ones (maxinstr._native) to the whole of maxinstr
    parts = imp.target.split(".")
    for depth, part in enumerate(parts[2:], start=2):
        owner = ".".join(parts[:depth])
        if private(part) and not (imp.module == owner or imp.module.startswith(owner + ".")):
            broken.append(f"private module: {imp.target} is private to {owner}, imported from {imp.module}")
            break
    # a private name of a public module is that module's own
    if imp.name is not None and private(imp.name) and not private(parts[-1]) and imp.module != imp.target:
        broken.append(f"private name: {imp.name} of {imp.target}, imported from {imp.module}")
    return broken


def all_imports() -> list[Import]:
    return [imp for path in sorted(SRC.rglob("*.py")) for imp in imports_of(path)]


def lazy_exports() -> list[Import]:
    """The root's lazy re-exports as imports: maxinstr/__init__.py's `__getattr__` imports the
    module `_EXPORTS` names for a public name with `importlib.import_module(module)`, a variable
    that `ast` cannot follow. They run at the first use of the name, once the root has been
    imported, so they cannot break an import in progress; they count as the root's imports all
    the same (rule 4: every import counts), read from `_EXPORTS`, which must stay a literal."""
    tree = ast.parse(ROOT_INIT.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
                exports = ast.literal_eval(node.value)
                return [Import(ROOT_INIT, node.lineno, "maxinstr", module, None) for module in sorted(set(exports.values()))]
    raise AssertionError(f"{ROOT_INIT}: no literal _EXPORTS (the lazy re-exports tests/test_layers.py reads)")


def import_graph(skip: set[tuple[str, str]] = frozenset()) -> dict[str, dict[str, Import]]:
    """module -> {module it imports -> the first such import}. `from package import name` is an
    import of the package (its __init__.py), `import package.sub` of the submodule only (Python
    runs the package's __init__.py first, but that is no edge: a package importing its own
    submodules is what packages do). An importlib call naming a prefix (`f"maxinstr.cli.{x}"`)
    comes out as the importing package itself: no edge."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in sorted(all_imports() + lazy_exports(), key=lambda imp: (imp.module, imp.line)):
        if imp.target != imp.module and (imp.module, imp.target) not in skip:
            graph.setdefault(imp.module, {}).setdefault(imp.target, imp)
    return graph


def import_loops(graph: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """One loop of each strongly connected group of modules, as its imports in order: a -> b -> ... -> a."""
    return [[graph[a][b] for a, b in zip(loop, loop[1:])] for loop in cycles(graph)]


def loop_text(loop: list[Import]) -> str:
    return " -> ".join([loop[0].module] + [f"{imp.target} ({imp.where()})" for imp in loop])


def test_every_package_has_a_layer():
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    modules |= {p.name.split(".")[0] for p in SRC.glob("_native*") if p.suffix in {".pyi", ".so"}}
    assert packages <= set(LAYER_OF), f"packages in no layer: {sorted(packages - set(LAYER_OF))}"
    assert modules <= BASE, f"top-level modules not in BASE: {sorted(modules - BASE)}"


def test_imports_follow_the_layers():
    problems = []
    for imp in all_imports():
        if (imp.module, imp.target + (f".{imp.name}" if imp.name else "")) in ALLOWED:
            continue
        problems += [f"{imp.where()}: {rule}" for rule in violations(imp)]
    assert not problems, "imports against docs/architecture.md's layers:\n" + "\n".join(problems)


def test_no_import_loops():
    """No module imports one that imports it back, directly or round a loop, inside a package
    as well as between packages (the layers already keep loops from crossing them)."""
    loops = import_loops(import_graph(skip=set(ALLOWED)))
    assert not loops, "import loops:\n" + "\n".join(loop_text(loop) for loop in loops)


def test_nothing_below_the_cli_imports_from_the_package_root():
    """The root (maxinstr/__init__.py) is the users' front door: below the CLI a name comes from
    its own module (`maxinstr._version.__version__`, `maxinstr._native`), never from the root."""
    taken = [f"{imp.where()}: {imp.module} takes {imp.name}" for imp in all_imports()
             if imp.target == "maxinstr" and imp.name is not None and unit_of(imp.module) != "cli"]
    assert not taken, "names taken from maxinstr/__init__.py below the CLI:\n" + "\n".join(taken)


def test_allowances_are_still_needed():
    seen = {(imp.module, imp.target + (f".{imp.name}" if imp.name else "")) for imp in all_imports() if violations(imp)}
    seen |= {(imp.module, imp.target) for loop in import_loops(import_graph()) for imp in loop}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED names imports that no longer break a rule (remove them): {stale}"


def test_the_doc_draws_this_table():
    """docs/architecture.md's diagram: one line a layer (`L3  record  traces  │ what they are`),
    and the L0 line names the base modules."""
    lines = re.findall(r"^L(\d+) +([a-z_ ]+?) *(?:│(.*))?$", DOC.read_text(), re.M)
    drawn = {int(n): tuple(units.split()) for n, units, _ in lines}
    assert drawn == dict(enumerate(LAYERS)), "docs/architecture.md's layer diagram differs from LAYERS here"
    base_line = next(text for n, _, text in lines if n == "0")
    assert set(base_line.split()) == BASE, "docs/architecture.md's L0 line differs from BASE here"


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("from maxinstr.attribute.intervals import correlation_join", "a layer above it"),
        ("from maxinstr.record import attrs", "a package of its own layer"),
        ("from maxinstr.render import _fmt", "private module"),
        ("import maxinstr.render._ranks", "private module"),
        ("from maxinstr.sample.base import _perf_ns", "private name"),
        ("import maxinstr\nmaxinstr.cli", "a layer above it"),
        ("import maxinstr\nmaxinstr.session", "a layer above it"),
        ("def f():\n    import maxinstr.analyze.report", "a layer above it"),
        ("if TYPE_CHECKING:\n    from maxinstr.analyze import report", "a layer above it"),
        ("from ..analyze import report", "a layer above it"),
        ("importlib.import_module(f'maxinstr.render.{fmt}')", "a layer above it"),
        ("from maxinstr import __version__", "package root"),
        ("import maxinstr\nmaxinstr.session", "package root"),
    ],
)
def test_a_planted_import_is_caught(source, rule):
    """The checker itself: each kind of import, planted in a module of traces/ (L4), is reported."""
    planted = SRC / "traces" / "planted.py"
    got = [text for imp in imports_of(planted, source) for text in violations(imp)]
    assert any(rule in text for text in got), got


def test_a_planted_render_import_is_caught():
    got = [text for imp in imports_of(SRC / "render" / "planted.py", "from maxinstr.rundir import load") for text in violations(imp)]
    assert got == ["layers: render imports maxinstr.rundir.load from rundir; render imports only the base, analyze"]


def test_a_planted_loop_is_caught():
    """The loop finder itself, on a planted graph: a package and its submodule importing each
    other (the shape of the root's lazy re-exports too), and a loop of three."""
    def imp(module: str, target: str) -> Import:
        return Import(SRC / "planted.py", 1, module, target, None)

    graph = {m: {t: imp(m, t) for t in ts} for m, ts in {
        "p": {"p.sub"}, "p.sub": {"p", "q"},
        "a": {"b"}, "b": {"c"}, "c": {"a", "q"},
    }.items()}
    loops = sorted([[(i.module, i.target) for i in loop] for loop in import_loops(graph)])
    assert loops == [[("a", "b"), ("b", "c"), ("c", "a")], [("p", "p.sub"), ("p.sub", "p")]]
    del graph["c"]["a"]  # an allowed edge is left out of the graph: that loop is gone
    assert [[i.module for i in loop] for loop in import_loops(graph)] == [["p", "p.sub"]]


def test_the_roots_lazy_exports_count():
    """`maxinstr.instrument` and the other lazy names are imports of their modules by the root."""
    assert {imp.target for imp in lazy_exports()} >= {"maxinstr.record", "maxinstr.record.session", "maxinstr.rundir",
                                                      "maxinstr.launch.instrument"}
