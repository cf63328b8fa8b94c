"""mypy plugin: ``d.get("key")`` on a TypedDict that declares no such key is an error.

mypy accepts any string key in a TypedDict's ``.get`` (PEP 589 allows it: a value of the type may
hold more keys than it declares) and types the result ``object``, so a misspelt or renamed key
read that way passes the type check. maxinstr's report (maxinstr/analyze/schema.py) is read through
``.get`` nearly everywhere, and every key it holds is declared there: a key outside its TypedDict
is a mistake. The error is mypy's own for ``d["key"]`` (code ``typeddict-item``); the return type
is what mypy gives anyway. Loaded by pyproject.toml's ``[tool.mypy] plugins``.
"""

from __future__ import annotations

from typing import Callable

from mypy.errorcodes import TYPEDDICT_ITEM
from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType, get_proper_type


def _checked_get(ctx: MethodContext) -> Type:
    td = get_proper_type(ctx.type)
    if isinstance(td, TypedDictType) and ctx.args and len(ctx.args[0]) == 1:
        for key in try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or ():
            if key not in td.items:
                name = td.fallback.type.name
                ctx.api.fail(f'TypedDict "{name}" has no key "{key}"', ctx.context, code=TYPEDDICT_ITEM)
    return typed_dict_get_callback(ctx)


class TypedDictGetPlugin(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return _checked_get if fullname == "typing.Mapping.get" else None


def plugin(version: str) -> type[Plugin]:
    return TypedDictGetPlugin
