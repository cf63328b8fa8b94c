"""Find the runnable shell commands in the docs.

A runnable block is a fenced block whose info string starts with `console`:

    ```console requires=max
    $ python examples/max_block.py --run-dir runs/max_block --no-report
    max_block: 4 requests x 16 tokens on CPU; ...
    $ maxinstr report runs/max_block
    ```

Lines starting with `$ ` are commands (a trailing backslash continues one on the next line);
every other line is output shown to the reader. Of that output, the rows of a table (a line with
three or more `│`) must stand, as shown, in what the block's commands printed (at 120 columns):
a doc whose numbers went stale fails. Words after `console`:

- `requires=MOD[,MOD]`: needs an interpreter that imports MOD (tests/examples/examples_runner.py)
- `gpu`: needs a GPU (the test carries `@pytest.mark.gpu`; the H200 step runs it)
- `status=N`: the commands are expected to exit with status N (default 0)

All blocks of one file run in order in one scratch directory, so a later block can read the
run directory an earlier one wrote. `python` and `maxinstr` mean the chosen interpreter and
`python -m maxinstr`; `examples/` and `tests/` are the repository's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The files whose console blocks are run (docs owned by the examples/guide part).
DOC_FILES = ("README.md", "docs/guide.md", "docs/bring-up.md", "docs/troubleshooting.md", "docs/cli.md")

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(.*)$")


@dataclass
class Block:
    path: str
    line: int
    commands: list[str]
    requires: tuple[str, ...] = ()
    gpu: bool = False
    status: int = 0
    tags: tuple[str, ...] = field(default=())
    table_rows: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse(text: str, path: str) -> list[Block]:
    """Every `console` block of `text` (path is only for the ids)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(2), m.group(3).split()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if info and info[0] == "console":
            body = [ln.strip() for ln in lines[i + 1 : j]]
            commands: list[str] = []
            pending = ""
            for ln in body:
                if pending:
                    pending += "\n" + ln
                elif ln.startswith("$ "):
                    pending = ln[2:]
                else:
                    continue
                if not pending.endswith("\\"):
                    commands.append(pending)
                    pending = ""
            rows = [ln for ln in body if not ln.startswith("$ ") and ln.count("│") >= 3]
            block = Block(path, i + 1, commands, tags=tuple(info[1:]), table_rows=rows)
            for tag in info[1:]:
                if tag.startswith("requires="):
                    block.requires = tuple(t for t in tag.split("=", 1)[1].split(",") if t)
                elif tag == "gpu":
                    block.gpu = True
                elif tag.startswith("status="):
                    block.status = int(tag.split("=", 1)[1])
                else:
                    raise ValueError(f"{path}:{i + 1}: unknown console block tag {tag!r}")
            blocks.append(block)
        i = j + 1
    return blocks


def doc_blocks(files: tuple[str, ...] = DOC_FILES) -> list[Block]:
    out: list[Block] = []
    for rel in files:
        p = REPO / rel
        if p.exists():
            out.extend(parse(p.read_text(), rel))
    return out
