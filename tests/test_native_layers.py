"""The native modules' include order (docs/architecture.md, "The native core"): a unit (a header
and its .cpp, or a .cpp alone) includes only units of a lower layer, so the include graph of
csrc/core and csrc/columns has no loop. Read from the sources: every `#include "..."`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.graphs import cycles

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
DOC = ROOT / "docs" / "architecture.md"

# The order, bottom to top, per native module (a folder of csrc/): the one place it is written
# down (docs/architecture.md draws it; test_the_doc_draws_this_table holds the drawing to this).
ORDER: dict[str, list[tuple[str, ...]]] = {
    "core": [
        ("base",),
        ("state", "records"),
        ("dispatch", "attrs_json"),
        ("markers", "placer", "writer", "cupti_link", "cupti_buffers"),
        ("events",),
        ("floor", "profiler"),
        ("stage",),
        ("launch_tags",),
        ("module",),
    ],
    "columns": [
        ("sqlite", "btree", "groups", "intervals"),
        ("query",),
        ("module",),
    ],
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_sources() -> dict[str, str]:
    """{"core/events.h": text, ...}: every C++ source and header of the native modules."""
    return {
        f"{p.parent.name}/{p.name}": p.read_text()
        for folder in sorted(CSRC.iterdir())
        if folder.is_dir()
        for p in sorted(folder.iterdir())
        if p.suffix in {".h", ".cpp"}
    }


def unit_of(path: str) -> str:
    """core/events.cpp -> core/events: a header and its .cpp are one unit."""
    return path.rsplit(".", 1)[0]


def include_edges(sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(file, included file, problem or "") for every `#include "..."`; included files are named
    as their folder's (the modules include nothing across folders)."""
    edges = []
    for path, text in sources.items():
        folder = path.split("/")[0]
        for name in INCLUDE.findall(text):
            target = f"{folder}/{name}"
            edges.append(
                (
                    path,
                    target,
                    ""
                    if target in sources
                    else f"{path} includes {name}, not a file of csrc/{folder}",
                )
            )
    return edges


def problems(
    sources: dict[str, str], order: dict[str, list[tuple[str, ...]]]
) -> list[str]:
    """Every file missing from the table, table entry without a file, include against the order
    and include loop, one line each."""
    layer = {
        f"{module}/{unit}": n
        for module, rows in order.items()
        for n, units in enumerate(rows)
        for unit in units
    }
    found = []
    units = {unit_of(path) for path in sources}
    found += [
        f"{u}: a unit missing from the order table" for u in sorted(units - set(layer))
    ]
    found += [
        f"{u}: in the order table, but no such file" for u in sorted(set(layer) - units)
    ]
    graph: dict[str, dict[str, str]] = {}
    for path, target, problem in include_edges(sources):
        if problem:
            found.append(problem)
            continue
        u, t = unit_of(path), unit_of(target)
        if u == t:
            if not (path.endswith(".cpp") and target.endswith(".h")):
                found.append(
                    f"{path} includes {target}: a header includes only headers of other units"
                )
            continue
        graph.setdefault(u, {}).setdefault(t, f"{path} includes {target.split('/')[1]}")
        if u in layer and t in layer and layer[t] >= layer[u]:
            found.append(
                f"{path} includes {target.split('/')[1]}: layer {layer[t]} from layer {layer[u]}, against the order"
            )
    found += [f"include loop: {loop}" for loop in loops(graph)]
    return found


def loops(graph: dict[str, dict[str, str]]) -> list[str]:
    """The shortest cycle through each unit of a group of units that reach one another, said with its includes."""
    return [" -> ".join(loop) + " (" + "; ".join(graph[a][b] for a, b in zip(loop, loop[1:])) + ")"
            for loop in cycles(graph, through_each=True)]


def test_includes_follow_the_order():
    found = problems(read_sources(), ORDER)
    assert not found, (
        "csrc/ against docs/architecture.md's native dependency order:\n"
        + "\n".join(found)
    )


def test_the_doc_draws_this_table():
    """docs/architecture.md's "Dependency order" table: one row a layer, `| 3 | `events` | `query` |`."""
    section = DOC.read_text().split("**Dependency order.**", 1)[1].split("\n\n**", 1)[0]
    rows = re.findall(r"^\| (\d+) \|([^|\n]*)\|([^|\n]*)\|$", section, re.M)
    drawn = {
        m: {int(n): tuple(re.findall(r"`([a-z_]+)`", cols[i])) for n, *cols in rows}
        for i, m in enumerate(ORDER)
    }
    want = {m: {n: units for n, units in enumerate(rows)} for m, rows in ORDER.items()}
    for m in ORDER:  # a module with fewer layers leaves its column empty below
        drawn[m] = {n: units for n, units in drawn[m].items() if units}
    assert drawn == want, (
        "docs/architecture.md's native dependency order differs from ORDER here"
    )


def test_the_table_names_the_modules_built():
    built = {p.parent.name for p in CSRC.glob("*/CMakeLists.txt")}
    assert built == set(ORDER)


TOY = {"m": [("base",), ("low",), ("high",), ("module",)]}
TOY_SOURCES = {
    "m/base.h": "",
    "m/low.h": '#include "base.h"\n',
    "m/low.cpp": '#include "low.h"\n',
    "m/high.h": '#include "low.h"\n',
    "m/high.cpp": '#include "high.h"\n#include "base.h"\n',
    "m/module.cpp": '#include "high.h"\n#include "low.h"\n',
}


def test_the_toy_tree_passes():
    assert problems(TOY_SOURCES, TOY) == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"m/low.cpp": '#include "low.h"\n#include "high.h"\n'},
            "m/low.cpp includes high.h: layer 2 from layer 1, against the order",
        ),
        (
            {"m/low.cpp": '#include "low.h"\n#include "high.h"\n'},
            "include loop: m/high -> m/low -> m/high (m/high.h includes low.h; m/low.cpp includes high.h)",
        ),
        (
            {"m/extra.cpp": '#include "base.h"\n'},
            "m/extra: a unit missing from the order table",
        ),
        (
            {"m/low.h": '#include "gone.h"\n'},
            "m/low.h includes gone.h, not a file of csrc/m",
        ),
        (
            {"m/low.h": '#include "low.h"\n'},
            "m/low.h includes m/low.h: a header includes only headers of other units",
        ),
    ],
)
def test_a_planted_include_is_caught(change, said):
    assert said in problems({**TOY_SOURCES, **change}, TOY)


def test_a_loop_inside_one_layer_is_caught():
    """Two units of one layer that include each other: against the order, and a loop."""
    order = {"m": [("base",), ("a", "b")]}
    got = problems(
        {"m/base.h": "", "m/a.h": '#include "b.h"\n', "m/b.h": '#include "a.h"\n'},
        order,
    )
    assert (
        "include loop: m/a -> m/b -> m/a (m/a.h includes b.h; m/b.h includes a.h)"
        in got
    )
