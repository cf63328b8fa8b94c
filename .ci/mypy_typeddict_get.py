"""mypy plugin: ``d.get("key")`` on a TypedDict that declares no such key is an error.

mypy accepts any string key in a TypedDict's ``.get`` (PEP 589 allows it: a value of the type may
hold more keys than it declares) and types the result ``object``, so a misspelt or renamed key
read that way passes the type check. maxinstr's report (maxinstr/analyze/schema.py) is read through
``.get`` nearly everywhere, and every key it holds is declared there: a key outside its TypedDict
is a mistake. The error is mypy's own for ``d["key"]`` (code ``typeddict-item``); the return type
is what mypy gives anyway. Loaded by pyproject.toml's ``[tool.mypy] plugins``.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.errorcodes import TYPEDDICT_ITEM
from mypy.nodes import CallExpr, MemberExpr
from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType, UnionType, get_proper_type


def _receiver_items(ctx: MethodContext, td: TypedDictType) -> list[TypedDictType]:
    """The TypedDicts the ``.get`` receiver may be: mypy calls the hook once per item of a union
    (``x: Stage | PaceUnit``), and a key of any of them is fine there (``x.get("mix")`` is None
    for the item without it)."""
    call = ctx.context
    lookup = getattr(ctx.api, "lookup_type_or_none", None)
    if lookup is not None and isinstance(call, CallExpr) and isinstance(call.callee, MemberExpr):
        whole = lookup(call.callee.expr)
        if whole is not None and isinstance(union := get_proper_type(whole), UnionType):
            items = [t for t in (get_proper_type(i) for i in union.items) if isinstance(t, TypedDictType)]
            if items:
                return items
    return [td]


def _checked_get(ctx: MethodContext) -> Type:
    td = get_proper_type(ctx.type)
    if isinstance(td, TypedDictType) and ctx.args and len(ctx.args[0]) == 1:
        for key in try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or ():
            if not any(key in t.items for t in _receiver_items(ctx, td)):
                name = td.fallback.type.name
                ctx.api.fail(f'TypedDict "{name}" has no key "{key}"', ctx.context, code=TYPEDDICT_ITEM)
    return typed_dict_get_callback(ctx)


class TypedDictGetPlugin(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return _checked_get if fullname == "typing.Mapping.get" else None


def plugin(version: str) -> type[Plugin]:
    return TypedDictGetPlugin
