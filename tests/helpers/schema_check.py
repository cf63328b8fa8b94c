"""A report (or a part of one) against the schema's TypedDicts (maxinstr/analyze/schema.py), at
run time: the keys each class declares, the ``Always[...]`` ones present, values of the declared
types. Used by tests/analyze/test_schema.py and tests/reliability/test_ranks.py."""

from __future__ import annotations

import types
import typing

from maxinstr.analyze import schema


def always(td: type) -> set[str]:
    """The keys of a schema TypedDict marked ``Always[...]``."""
    return {k for k, t in typing.get_type_hints(td, include_extras=True).items()
            if typing.get_origin(t) is typing.Annotated and schema.ALWAYS in t.__metadata__}


def problems(value: object, tp: object, path: str = "report") -> list[str]:
    """Where ``value`` is not of type ``tp`` (a TypedDict, list/dict/Literal/union of them, or a
    plain type), as 'path: what' lines."""
    if tp is typing.Any:
        return []
    if tp is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [problems(value, t, path) for t in typing.get_args(tp)]
        return [] if any(not o for o in options) else min(options, key=len)
    if origin is typing.Literal:
        return [] if value in typing.get_args(tp) else [f"{path}: {value!r} not in {typing.get_args(tp)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        (item,) = typing.get_args(tp)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a dict"]
        _, item = typing.get_args(tp)
        return [p for k, v in value.items() for p in problems(v, item, f"{path}.{k}")]
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a {tp.__name__}"]
        hints = typing.get_type_hints(tp)
        out = [f"{path}.{k}: not in {tp.__name__}" for k in value if k not in hints]
        out += [f"{path}.{k}: missing (Always in {tp.__name__})" for k in always(tp) if k not in value]
        return out + [p for k, v in value.items() if k in hints for p in problems(v, hints[k], f"{path}.{k}")]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)  # type: ignore[arg-type]
    return [] if ok else [f"{path}: {value!r} is not {getattr(tp, '__name__', tp)}"]
