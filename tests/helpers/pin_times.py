"""Host durations pinned in a real run directory, for tests whose verdict must not depend on how
long a ``time.sleep`` took on a loaded machine (a 1 ms sleep measured 4 ms at load 13 on two
cores). The session, the parts and every record stay the real ones; only ``host_end_ns`` of the
named stages moves, and only earlier: a sleep never ends early, so the pinned duration is the
one the program asked for, never longer than what was recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def part_records(run_dir: str | Path) -> Iterator[tuple[Path, dict[int, str], np.ndarray]]:
    """Each part of a run directory (in name order) as (folder, name of each name id, its stage
    rows); rows changed by the caller are written back when it asks for the next part."""
    from maxinstr.rundir import format as fmt

    for part in sorted((Path(run_dir) / "parts").iterdir()):
        names = {d["id"]: d["s"] for d in map(json.loads, (part / fmt.STRINGS_FILE).read_text().splitlines())}
        rows = np.fromfile(part / fmt.STAGES_FILE, dtype=fmt.STAGE_DTYPE)
        yield part, names, rows
        rows.tofile(part / fmt.STAGES_FILE)


def pin_host_durations(run_dir: str | Path, durations_ns: dict[str, int]) -> int:
    """Set every record whose name path (``"decode"``, ``"decode/layer"``: the names from its
    top-level stage down) is a key of ``durations_ns`` to last exactly that long. Returns how
    many records were pinned; a record shorter than its pinned duration is an error."""
    pinned = 0
    for _, names, rows in part_records(run_dir):
        row_of = {int(i): k for k, i in enumerate(rows["id"])}
        paths: list[str] = []
        for k in range(len(rows)):  # a parent is recorded when it closes, after its children: walk up
            chain, j = [], k
            while j is not None:
                chain.append(names[int(rows["name_id"][j])])
                j = row_of.get(int(rows["parent_id"][j]))
            paths.append("/".join(reversed(chain)))
        for k, path in enumerate(paths):
            want = durations_ns.get(path)
            if want is None:
                continue
            got = int(rows["host_end_ns"][k] - rows["host_start_ns"][k])
            if got < want:
                raise AssertionError(f"{path} record {k} lasted {got} ns, less than the {want} ns pinned")
            rows["host_end_ns"][k] = rows["host_start_ns"][k] + want
            pinned += 1
    return pinned
