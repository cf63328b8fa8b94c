"""Every shell command in the user docs runs, so the docs cannot rot (see doc_blocks.py for
the block syntax). Blocks needing MAX run in CI, which installs it; `gpu` blocks run on the H200
(benchmarks/device/60-examples.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from doc_blocks import REPO, doc_blocks, parse
from examples_runner import child_env, python_with

BLOCKS = doc_blocks()
_SCRATCH: dict[str, Path] = {}


def _scratch(tmp_path_factory, path: str) -> Path:
    """One scratch directory per doc file, holding links to the repo's examples/ and tests/."""
    if path not in _SCRATCH:
        d = tmp_path_factory.mktemp(Path(path).stem.replace(".", "_"))
        for name in ("examples", "tests"):
            (d / name).symlink_to(REPO / name)
        _SCRATCH[path] = d
    return _SCRATCH[path]


def _bin_dir(d: Path, python: str) -> Path:
    """`python` and `maxinstr` on PATH mean the chosen interpreter; `max` (MAX's CLI), that
    interpreter's own where it has one."""
    b = d / ".bin"
    b.mkdir(exist_ok=True)
    programs = [("python", f'exec {python} "$@"'), ("python3", f'exec {python} "$@"'),
                ("maxinstr", f'exec {python} -m maxinstr "$@"')]
    if (Path(python).parent / "max").exists():
        programs.append(("max", f'exec {Path(python).parent / "max"} "$@"'))
    for name, body in programs:
        f = b / name
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(0o755)
    return b


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.id, marks=[pytest.mark.gpu] if b.gpu else []) for b in BLOCKS]
    + [pytest.param(None, id="no-blocks")] * (not BLOCKS),
)
def test_doc_block_runs(block, tmp_path_factory):
    if block is None:
        pytest.skip("no console blocks in the docs yet")
    python = sys.executable
    for module in block.requires:
        found = python_with(module)
        if found is None:
            pytest.skip(f"{block.id} needs {module}, not installed for any candidate interpreter")
        python = found
    d = _scratch(tmp_path_factory, block.path)
    env = child_env(python, COLUMNS="120")
    env["PATH"] = f"{_bin_dir(d, python)}{os.pathsep}{env['PATH']}"
    keep = os.environ.get("MAXINSTR_DOCS_OUT")  # the H200 step keeps what the gpu blocks printed
    printed = ""
    for command in block.commands:
        done = subprocess.run(["bash", "-c", command], cwd=d, env=env, capture_output=True, text=True, timeout=900)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            name = block.id.replace("/", "_").replace(":", "_").replace(".md", "") + ".txt"
            with open(Path(keep) / name, "a") as f:
                f.write(f"$ {command}\n{done.stdout}{done.stderr}[exit {done.returncode}]\n")
        assert done.returncode == block.status, (
            f"{block.id}: `{command}` exited {done.returncode}, expected {block.status}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        printed += done.stdout
    stale = [row for row in block.table_rows if row not in printed]
    assert not stale, f"{block.id}: table rows shown in the doc that the commands did not print:\n" + "\n".join(stale)


def test_parser_reads_tags_commands_and_continuations():
    text = "\n".join([
        "text", "```console requires=max gpu status=2", "$ python a.py \\", "    --flag", "output line",
        "$ maxinstr report runs/x", "```", "```sh", "$ not a console block", "```",
    ])
    (block,) = parse(text, "x.md")
    assert block.requires == ("max",) and block.gpu and block.status == 2 and block.line == 2
    assert block.commands == ["python a.py \\\n--flag", "maxinstr report runs/x"]
    with pytest.raises(ValueError, match="unknown console block tag"):
        parse("```console sometimes\n$ true\n```", "y.md")


def test_readme_ci_lines_match_ci_script():
    """README's "MAX example" names the lines .ci/run uses to install MAX; once .ci/run installs
    MAX, it must do so with exactly those lines."""
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    marker = "```sh ci"
    if marker not in readme:
        pytest.skip("README has no CI block yet")
    block = readme.split(marker, 1)[1].split("```", 1)[0]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if "max" not in ci:
        pytest.skip(".ci/run does not install MAX yet (the README's lines are for the coordinator to merge)")
    for ln in lines:
        assert ln in ci, f".ci/run lacks README's line: {ln}"


def test_readme_quickstart_is_the_example_file():
    """The README's 30-second example is examples/quickstart.py, verbatim (the README's console
    block runs the file, so the code shown is the code run)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## A 30-second example", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0].strip()
    assert code == (REPO / "examples" / "quickstart.py").read_text().strip()
    assert "$ python examples/quickstart.py" in section and "$ maxinstr report runs/quickstart" in section


def test_every_doc_with_console_blocks_is_run():
    """A `console` block in any doc runs only if its file is in doc_blocks.DOC_FILES: a new doc
    with runnable blocks must be added there, or its commands would rot unseen."""
    from doc_blocks import DOC_FILES

    with_blocks = {str(p.relative_to(REPO)) for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
                   if "```console" in p.read_text()}
    assert with_blocks <= set(DOC_FILES), sorted(with_blocks - set(DOC_FILES))
