"""instrument(): wrapping third-party functions and methods in stages, now or at import."""
from __future__ import annotations

import functools
import sys
import textwrap

import pytest

from maxinstr.errors import MaxinstrError
from maxinstr.launch import instrument as ins

LIB = '''
def top(x):
    """Top-level function."""
    return x + 1

class Model:
    scale = 3
    def forward(self, x):
        return x * self.scale
    @staticmethod
    def helper(x):
        return -x
    @classmethod
    def build(cls):
        return cls()
    class Inner:
        def step(self):
            return "inner"

async def agen(x):
    return x * 2
'''


class Recorder:
    """A stage factory that records enter/exit order, shaped like maxinstr.stage."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, name: str):
        rec = self

        def deco(func):
            @functools.wraps(func)
            def wrapper(*a, **k):
                rec.events.append(("enter", name))
                try:
                    return func(*a, **k)
                finally:
                    rec.events.append(("exit", name))
            return wrapper
        return deco


@pytest.fixture
def lib(tmp_path, monkeypatch):
    """A fresh, never-imported module `thirdparty_<n>` on sys.path."""
    name = f"thirdparty_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(LIB))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_parse_spec():
    assert ins.parse_spec("a.b:C.f=dec") == ins.StageSpec("a.b", "C.f", "dec")
    assert ins.parse_spec("a:f") == ins.StageSpec("a", "f", "f")
    for bad in ("a.b", "a:", ":f", "a:f-g", "a b:f", "a:C..f"):
        with pytest.raises(MaxinstrError, match="MODULE:QUALNAME|not a module"):
            ins.parse_spec(bad)


def test_eager_wraps_functions_methods_static_class_and_nested(lib):
    rec = Recorder()
    for target in ("top", "Model.forward", "Model.helper", "Model.build", "Model.Inner.step"):
        assert ins.instrument(f"{lib}:{target}", stage_factory=rec) is True
    mod = sys.modules[lib]
    assert mod.top(1) == 2 and mod.top.__doc__ == "Top-level function."
    m = mod.Model.build()
    assert m.forward(2) == 6 and mod.Model.helper(4) == -4 and mod.Model.Inner().step() == "inner"
    assert rec.events == [
        ("enter", "top"), ("exit", "top"),
        ("enter", "Model.build"), ("exit", "Model.build"),
        ("enter", "Model.forward"), ("exit", "Model.forward"),
        ("enter", "Model.helper"), ("exit", "Model.helper"),
        ("enter", "Model.Inner.step"), ("exit", "Model.Inner.step"),
    ]
    # Same target twice: wrapped once.
    ins.instrument(f"{lib}:top", stage_factory=rec)
    rec.events.clear()
    mod.top(0)
    assert rec.events == [("enter", "top"), ("exit", "top")]


def test_eager_errors_are_one_line(lib):
    with pytest.raises(MaxinstrError, match=r"has no Model.nope"):
        ins.instrument(f"{lib}:Model.nope", stage_factory=Recorder())
    with pytest.raises(MaxinstrError, match="is a int, not a function"):
        ins.instrument(f"{lib}:Model.scale", stage_factory=Recorder())
    with pytest.raises(MaxinstrError, match="cannot import no_such_module_xyz"):
        ins.instrument("no_such_module_xyz:f", stage_factory=Recorder())


def test_lazy_applies_at_first_import_even_for_from_imports(lib):
    rec = Recorder()
    assert ins.instrument(f"{lib}:Model.forward", name="forward", lazy=True, stage_factory=rec) is False
    assert lib not in sys.modules and f"{lib}:Model.forward" in ins.pending_targets()
    ns: dict = {}
    exec(f"from {lib} import Model", ns)  # the way library code imports it
    assert ns["Model"]().forward(1) == 3
    assert rec.events == [("enter", "forward"), ("exit", "forward")]
    assert f"{lib}:Model.forward" not in ins.pending_targets()


def test_lazy_problem_is_reported_not_raised(lib, capsys):
    ins.instrument(f"{lib}:Nope.f", lazy=True, stage_factory=Recorder())
    __import__(lib)  # the import itself must succeed
    assert f"maxinstr: --stage {lib}:Nope.f: {lib} has no Nope" in capsys.readouterr().err


def test_with_the_real_stage(lib):
    record = pytest.importorskip("maxinstr.record")
    ins.instrument(f"{lib}:Model.forward", name="fwd")
    mod = sys.modules[lib]
    assert mod.Model().forward(5) == 15  # result and self still right through the native stage
    assert getattr(mod.Model.forward, "__maxinstr_stage__", None) == "fwd"
    assert record.is_enabled() in (True, False)
