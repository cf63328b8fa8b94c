"""Every numeric option of every `maxinstr` command is range-checked by click: a value out of its
range, nan or inf is a usage error (exit 2, naming the option) before the command does anything.
The commands and their options are walked, not listed, so a new option is held to it too."""

from __future__ import annotations

import importlib

import click
import pytest

from maxinstr.cli import SUBCOMMANDS, Seconds, cli, main


def _commands() -> list[tuple[list[str], click.Command]]:
    out: list[tuple[list[str], click.Command]] = []

    def walk(path: list[str], cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk([*path, name], sub)
        else:
            out.append((path, cmd))

    for name, module in sorted(SUBCOMMANDS.items()):
        walk([name], importlib.import_module(f"maxinstr.cli.{module}").command)
    return out


def _numeric_options() -> list[tuple[list[str], click.Option]]:
    return [(path, p) for path, cmd in _commands() for p in cmd.params
            if isinstance(p, click.Option) and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]


NUMERIC = _numeric_options()


def _bad_values(opt: click.Option) -> list[str]:
    """Values the option must refuse: just below its range, and for seconds nan and inf."""
    kind = opt.type
    assert isinstance(kind, click.types._NumberRangeBase) and kind.min is not None
    if isinstance(kind, click.FloatRange):
        return ["nan", "inf", "-inf", "-1"] + (["0"] if kind.min_open else [])
    return [str(int(kind.min) - 1)]


def test_the_walk_finds_the_options_the_issue_named():
    names = {(" ".join(path), max(opt.opts, key=len)) for path, opt in NUMERIC}
    assert {("run", "--warmup"), ("run", "--repeat"), ("run", "--window"), ("run", "--timeout"),
            ("report", "--warmup"), ("deep-dive", "--launch-skip"), ("snapshot", "--interval"),
            ("server start", "--ready-timeout")} <= names
    assert len(cli.list_commands(click.Context(cli))) == len(SUBCOMMANDS)


@pytest.mark.parametrize("path,opt", NUMERIC, ids=[f"{' '.join(p)} {max(o.opts, key=len)}" for p, o in NUMERIC])
def test_every_numeric_option_has_a_range(path, opt):
    """An int is an IntRange with a lower bound; a float is Seconds (finite, and a range)."""
    if isinstance(opt.type, click.types.FloatParamType):
        assert isinstance(opt.type, Seconds), f"maxinstr {' '.join(path)} {opt.opts[0]}: a float without Seconds"
    else:
        assert isinstance(opt.type, click.IntRange) and opt.type.min is not None


@pytest.mark.parametrize("path,opt", NUMERIC, ids=[f"{' '.join(p)} {max(o.opts, key=len)}" for p, o in NUMERIC])
def test_every_numeric_option_refuses_what_is_out_of_range(path, opt, capsys):
    flag = max(opt.opts, key=len)
    for value in _bad_values(opt):
        # the bad option comes first: click processes what is on the command line in its order,
        # so it fails before a missing argument would (and before anything runs)
        rc = main([*path, f"{flag}={value}", "--", "true"])
        err = capsys.readouterr().err
        assert rc == 2, f"maxinstr {' '.join(path)} {flag}={value}: exit {rc}\n{err}"
        assert f"Invalid value for '{flag}'" in err or f"Invalid value for '{opt.opts[0]}'" in err, err


def test_seconds_take_what_is_in_range():
    assert Seconds().convert("0.5", None, None) == 0.5
    assert Seconds(zero_ok=True).convert("0", None, None) == 0.0
    with pytest.raises(click.BadParameter, match="not a finite number"):
        Seconds().convert("nan", None, None)
    with pytest.raises(click.BadParameter, match="not in the range"):
        Seconds().convert("0", None, None)
