"""`maxinstr --help`, `--version` and every subcommand's help: they work without an installed
package, and each command's help shows at least one example invocation."""

from __future__ import annotations

import pytest

from maxinstr import __version__
from maxinstr.cli import main

COMMANDS = ["report", "compare", "snapshot", "run", "deep-dive", "server", "server start", "server window",
            "server stop", "server run"]


def test_version_works_from_a_source_tree(capsys):
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("report", "compare", "snapshot", "run", "deep-dive", "server"):
        assert f"  {name} " in out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_help_has_an_example(cmd, capsys):
    assert main([*cmd.split(), "--help"]) == 0
    out = capsys.readouterr().out
    examples = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(f"maxinstr {cmd}")]
    assert examples, f"`maxinstr {cmd} --help` shows no example:\n{out}"
