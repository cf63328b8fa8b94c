"""A report (or a part of one) checked against the schema's TypedDicts at run time: a saved
report is data anyone may have written, so a field of the wrong type is one line naming it, not
a ``TypeError`` inside a renderer (273 of 1,264 fuzzed reports, issue 29).
"""

from __future__ import annotations

import functools
import types
import typing
from pathlib import Path

from maxinstr._files import MAX_JSON_DEPTH, parse_json, read_regular
from maxinstr.analyze import schema
from maxinstr.errors import MaxinstrError


@functools.cache
def always(td: type) -> frozenset[str]:
    """The keys of a schema TypedDict marked ``Always[...]``."""
    return frozenset(k for k, t in typing.get_type_hints(td, include_extras=True).items()
                     if typing.get_origin(t) is typing.Annotated and schema.ALWAYS in t.__metadata__)


@functools.cache
def _hints(td: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(td)


def problems(value: object, tp: object, path: str = "report", *, extra_keys: bool = True,
             first: bool = False) -> list[str]:
    """Where ``value`` is not of type ``tp`` (a TypedDict, list/dict/Literal/union of them, or a
    plain type), as 'path: what' lines. ``extra_keys=False``: undeclared keys are allowed (a later
    maxinstr may add some). ``first``: stop at the first problem."""
    out: list[str] = []
    _check(value, tp, path, out, extra_keys, first)
    return out


def _check(value: object, tp: object, path: str, out: list[str], extra: bool, first: bool) -> None:
    if first and out:
        return
    if tp is typing.Any:
        return
    if tp is type(None):
        if value is not None:
            out.append(f"{path}: {_show(value)} is not null")
        return
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options: list[list[str]] = []
        for t in typing.get_args(tp):
            found: list[str] = []
            _check(value, t, path, found, extra, first)
            if not found:
                return
            options.append(found)
        best: list[str] = min(options, key=len)
        out.extend(best)
        return
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            out.append(f"{path}: {_show(value)} not in {typing.get_args(tp)}")
        return
    if origin is list:
        if not isinstance(value, list):
            out.append(f"{path}: {type(value).__name__}, not a list")
            return
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            _check(v, item, f"{path}[{i}]", out, extra, first)
            if first and out:
                return
        return
    if origin is dict:
        if not isinstance(value, dict):
            out.append(f"{path}: {type(value).__name__}, not a dict")
            return
        _, item = typing.get_args(tp)
        for k, v in value.items():
            _check(v, item, f"{path}.{k}", out, extra, first)
            if first and out:
                return
        return
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            out.append(f"{path}: {type(value).__name__}, not a {tp.__name__}")  # type: ignore[attr-defined]
            return
        hints = _hints(tp)
        if extra:
            out.extend(f"{path}.{k}: not in {tp.__name__}" for k in value if k not in hints)  # type: ignore[attr-defined]
        out.extend(f"{path}.{k}: missing (Always in {tp.__name__})"  # type: ignore[attr-defined]
                   for k in sorted(always(tp)) if k not in value)
        for k, v in value.items():
            if k in hints:
                _check(v, hints[k], f"{path}.{k}", out, extra, first)
                if first and out:
                    return
        return
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)  # type: ignore[arg-type]
    if not ok:
        out.append(f"{path}: {_show(value)} is not {getattr(tp, '__name__', tp)}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_report(text: str | bytes, source: str = "<report>") -> schema.Report:
    """Parse a saved JSON report, checking its schema, version and the type of every field
    (MaxinstrError naming ``source`` and the first problem)."""
    def refused(path: object, why: str) -> MaxinstrError:
        return MaxinstrError(f"{path}: {why.replace('not valid JSON', 'not JSON', 1)}")

    doc = parse_json(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text, Path(source), refused,
                     max_depth=MAX_JSON_DEPTH)
    if not isinstance(doc, dict) or doc.get("schema") != schema.SCHEMA:
        raise MaxinstrError(f"{source}: not a maxinstr report (\"schema\" is not \"{schema.SCHEMA}\")")
    if doc.get("version") != schema.VERSION:
        raise MaxinstrError(f"{source}: report version {doc.get('version')!r} is not supported (this maxinstr reads "
                            f"{schema.VERSION})")
    found = problems(doc, schema.Report, "report", extra_keys=False, first=True)
    if found:
        raise MaxinstrError(f"{source}: {found[0]}: not a report maxinstr wrote (re-render it from its run or trace)")
    return typing.cast(schema.Report, doc)


def read_report(path: str | object) -> schema.Report:
    """:func:`load_report` of the file ``path`` (only a regular file: a FIFO never blocks)."""
    data = read_regular(Path(str(path)), lambda p, why: MaxinstrError(f"{p}: {why}"))
    if data is None:
        raise MaxinstrError(f"{path}: no such file")
    return load_report(data, str(path))
