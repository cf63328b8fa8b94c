"""Wrap functions and methods of code you cannot edit in maxinstr stages (``"package.module:QualName"``);
lazily, at the module's first import (an import hook: a later ``from module import func`` gets it too).
A name ``@HOOK`` wraps with one of :data:`HOOKS` instead, for wrap points that need logic."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from maxinstr.errors import MaxinstrError
from maxinstr.integrations import max_pipeline

_WRAPPED_FLAG, HOOK_PREFIX = "__maxinstr_stage__", "@"


@dataclass(frozen=True)
class StageSpec:  # one ``MODULE:QUALNAME[=name]`` target
    module: str
    qualname: str
    name: str

    @property
    def target(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def text(self) -> str:  # the name written out: one spelling for one spec
        return f"{self.target}={self.name}"


def parse_spec(text: str) -> StageSpec:
    """Parse ``MODULE:QUALNAME[=name]``; raises MaxinstrError with the reason when malformed."""
    target, _, name = text.strip().partition("=")
    module, sep, qualname = target.partition(":")
    module, qualname, name = module.strip(), qualname.strip(), name.strip()
    parts = qualname.split(".") if qualname else []
    if not sep or not module or not parts or not all(p.isidentifier() for p in parts):
        raise MaxinstrError(f"--stage {text!r}: expected MODULE:QUALNAME[=name], e.g. mypkg.model:Model.forward=forward")
    if not all(p.isidentifier() for p in module.split(".")):
        raise MaxinstrError(f"--stage {text!r}: {module!r} is not a module name")
    if name.startswith(HOOK_PREFIX) and name[len(HOOK_PREFIX):] not in HOOKS:
        raise MaxinstrError(f"--stage {text!r}: no hook {name!r} (maxinstr's hooks: "
                            f"{', '.join(HOOK_PREFIX + h for h in sorted(HOOKS))})")
    return StageSpec(module, qualname, name or qualname)


def _record() -> Any:
    """maxinstr.record, at the first wrap and not before: its import joins the run's session."""
    import maxinstr.record

    return maxinstr.record


def _called_by_maxinstr(frame: Any) -> bool:
    """Whether the frame is maxinstr's own code (a module of it run with ``-m`` too: ``__main__``)."""
    if frame is None:
        return False
    name = frame.f_globals.get("__name__", "")
    if name == "__main__":
        name = getattr(frame.f_globals.get("__spec__"), "name", "") or ""
    return name == "maxinstr" or name.startswith("maxinstr.")


def _skip_own_calls(func: Callable, staged: Callable) -> Callable:
    """``staged``, but calls by maxinstr itself go to ``func`` (with ``--stage json:dumps`` the run's own
    JSON lines are not the program's stages); coroutines and async generators as they are."""
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        return staged
    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def gen_dispatch(*args: Any, **kwargs: Any) -> Any:
            target = func if _called_by_maxinstr(sys._getframe(1)) else staged
            return (yield from target(*args, **kwargs))

        return gen_dispatch

    @functools.wraps(func)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        return (func if _called_by_maxinstr(sys._getframe(1)) else staged)(*args, **kwargs)

    return dispatch


def apply_spec(spec: StageSpec, module: ModuleType, stage_factory: Callable[[str], Any] | None = None) -> None:
    """Replace ``spec.qualname`` inside the imported ``module`` by its stage-wrapped version."""
    parts = spec.qualname.split(".")
    owner: Any = module
    for i, part in enumerate(parts[:-1]):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise MaxinstrError(f"--stage {spec.target}: {module.__name__} has no {'.'.join(parts[: i + 1])}") from None
    attr = parts[-1]
    # the owner's own __dict__: staticmethod/classmethod are rewrapped, an inherited method wrapped here only
    raw = inspect.getattr_static(owner, attr, None) if inspect.isclass(owner) else getattr(owner, attr, None)
    if raw is None:
        raise MaxinstrError(f"--stage {spec.target}: {module.__name__} has no {spec.qualname}")
    rewrap: Any = None  # staticmethod, classmethod or None: how to wrap the instrumented function again
    if isinstance(raw, (staticmethod, classmethod)):
        func, rewrap = raw.__func__, staticmethod if isinstance(raw, staticmethod) else classmethod
    elif callable(raw):
        func = raw
    else:
        raise MaxinstrError(f"--stage {spec.target}: {spec.qualname} is a {type(raw).__name__}, not a function or method")
    if getattr(func, _WRAPPED_FLAG, None) is not None:
        return  # already instrumented (the same spec given twice, or a module reload)
    name = spec.name
    new: Any = stage_factory(name)(func) if stage_factory else (
        HOOKS[name[len(HOOK_PREFIX):]] if name.startswith(HOOK_PREFIX) else _record().stage(name))(func)
    if new is not func:  # (a factory in disabled mode returns the function untouched)
        if getattr(new, "__wrapped__", None) is None:
            functools.update_wrapper(new, func)
        new = _skip_own_calls(func, new)
        with contextlib.suppress(AttributeError, TypeError):
            setattr(new, _WRAPPED_FLAG, name)
    try:
        setattr(owner, attr, new if rewrap is None else rewrap(new))
    except (TypeError, AttributeError) as exc:
        # a method of a built-in (C) type, a read-only or slotted attribute: nothing to replace
        where = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__)
        raise MaxinstrError(f"--stage {spec.target}: cannot replace {where}.{attr} ({exc}); "
                            "wrap a Python function that calls it instead") from None


_lock = threading.RLock()  # the lazy specs: an import hook applies them right after their module loads
_pending: dict[str, list[tuple[StageSpec, Callable[[str], Any] | None]]] = {}
_errors: list[str] = []
_listeners: list[Callable[[StageSpec, str | None], None]] = []


def on_outcome(listener: Callable[[StageSpec, str | None], None]) -> None:
    """Call ``listener(spec, problem)`` as each lazy spec is applied (``problem`` None) or fails to."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


class _ApplyAfterExec(importlib.abc.Loader):  # the real loader, then the module's pending specs
    def __init__(self, inner: importlib.abc.Loader, fullname: str) -> None:
        self._inner, self._fullname = inner, fullname

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        with _lock:
            todo = _pending.pop(self._fullname, [])
        for spec, factory in todo:
            _apply_or_say(spec, module, factory)

    def __getattr__(self, item: str) -> Any:  # get_source, is_package, get_filename ...
        return getattr(self._inner, item)


class _StageImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            if fullname not in _pending:
                return None
        spec = next((s for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
                     and (s := f.find_spec(fullname, path, target)) is not None), None)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ApplyAfterExec(spec.loader, fullname)
        return spec


_hook = _StageImportHook()


def _apply_or_say(spec: StageSpec, module: ModuleType, factory: Callable[[str], Any] | None) -> bool:
    """apply_spec, a problem said in one line, not raised: it runs inside the user's import."""
    try:
        apply_spec(spec, module, factory)
        problem = None
    except Exception as exc:  # noqa: BLE001 - a wrap we did not foresee failing is still ours
        problem = str(exc) if isinstance(exc, MaxinstrError) else f"--stage {spec.target}: {type(exc).__name__}: {exc}"
        _errors.append(problem)
        sys.stderr.write(f"maxinstr: {problem}\n")
    for listener in list(_listeners):
        with contextlib.suppress(Exception):  # runs inside the user's import: never breaks it
            listener(spec, problem)
    return problem is None


def instrument(target: str, name: str | None = None, *, lazy: bool = False,
               stage_factory: Callable[[str], Any] | None = None) -> bool:
    """Wrap ``"module:QualName"`` in a stage named ``name`` (default: the QualName): now, importing the
    module, errors raised; with ``lazy``, at the module's first import, problems said in one line, never
    raised. True when applied now. ``stage_factory`` replaces :func:`maxinstr.stage` (tests)."""
    spec = parse_spec(target if name is None else f"{target}={name}")
    module = sys.modules.get(spec.module)
    if module is None and not lazy:
        try:
            module = importlib.import_module(spec.module)
        except ImportError as exc:
            raise MaxinstrError(f"--stage {spec.target}: cannot import {spec.module}: {exc}") from None
    if module is not None:
        if lazy:
            return _apply_or_say(spec, module, stage_factory)
        apply_spec(spec, module, stage_factory)
        return True
    with _lock:
        _pending.setdefault(spec.module, []).append((spec, stage_factory))
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
    return False


def rebind_aliases(specs: list[str]) -> None:
    """A module-level function wrapped after its module ran may be bound under other names already
    (``from .sub import f``): those get the wrapped function too, as had the hook wrapped it at once
    (docs/cli.md); the defining module's other names for it stay, as then, and so do maxinstr's."""
    wrapped: dict[int, tuple[Any, Any, str]] = {}  # id(original) -> (original, wrapped, its module)
    for text in specs:
        try:
            spec = parse_spec(text)
        except MaxinstrError:
            continue
        module = sys.modules.get(spec.module)
        if module is None or "." in spec.qualname:  # a method is wrapped on its class, shared by every alias
            continue
        new = getattr(module, spec.qualname, None)
        old = getattr(new, "__wrapped__", None) if getattr(new, _WRAPPED_FLAG, None) is not None else None
        if old is not None:
            wrapped[id(old)] = (old, new, spec.module)
    if not wrapped:
        return
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or name == "maxinstr" or name.startswith("maxinstr."):
            continue
        hits = [(k, wrapped[id(v)]) for k, v in list(namespace.items()) if id(v) in wrapped]
        for key, (old, new, home) in hits:
            if namespace.get(key) is old and name != home:
                namespace[key] = new


def pending_targets() -> list[str]:
    with _lock:
        return [s.target for specs in _pending.values() for s, _ in specs]


def instrument_errors() -> list[str]:  # problems met applying lazy targets (printed when they happened)
    return list(_errors)


# Hooks (``MODULE:QUALNAME=@HOOK`` wraps with HOOKS[HOOK](func)): each calls func exactly once and never lets
# a problem of its own reach the program. A spec names a hook, never code of its own.


def max_step(func: Callable) -> Callable:
    """A pipeline's ``execute(inputs)`` in a stage ``prefill``, ``decode`` or ``drain`` (``step_stage``)."""
    stage = _record().stage

    @functools.wraps(func)
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        inputs = kwargs["inputs"] if "inputs" in kwargs else args[0] if args else None
        name, attrs = max_pipeline.step_stage(inputs)
        with stage(name, **attrs):
            return func(self, *args, **kwargs)

    return execute


def max_model(func: Callable) -> Callable:
    """A pipeline's ``__init__``: then its model's class (``Llama3Model``) gets ``execute`` wrapped as ``forward``."""

    @functools.wraps(func)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        func(self, *args, **kwargs)
        spec, problem = max_pipeline.model_execute_spec(self)
        where = type(self).__qualname__
        try:
            if spec is not None:
                instrument(spec, lazy=True)  # its module is imported: applied now, or one line said
            else:
                sys.stderr.write(f"maxinstr: --stage @max-model ({where}): no forward stage: {problem}\n")
        except Exception as exc:  # noqa: BLE001 - inside MAX's constructor: never break it
            sys.stderr.write(f"maxinstr: --stage @max-model ({where}): {type(exc).__name__}: {exc}\n")

    return __init__


def max_arrival(func: Callable) -> Callable:
    """A tokenizer's ``new_context(request)``, then a mark ``queued`` (attr ``request``): its wait starts."""
    mark = _record().mark

    def said(context: Any) -> Any:
        with contextlib.suppress(Exception):  # a mark that fails must not lose the request
            mark(max_pipeline.QUEUED_MARK, request=max_pipeline.request_key(context))
        return context

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def new_context(*args: Any, **kwargs: Any) -> Any:
            return said(await func(*args, **kwargs))

        return new_context
    return functools.wraps(func)(lambda *args, **kwargs: said(func(*args, **kwargs)))


def max_tokenize(func: Callable) -> Callable:
    """MAX's ``run_with_default_executor(fn, *args)`` (the tokenizer's thread pool): ``fn`` in a stage
    ``tokenize`` on the pool's thread; around the coroutine, on the event loop's thread, a server's
    concurrent requests would each nest inside the one before."""
    if not inspect.iscoroutinefunction(func):
        raise MaxinstrError(f"@max-tokenize: {func.__qualname__} is not a coroutine function (MAX {max_pipeline.MAX_RELEASE}'s was)")
    stage = _record().stage

    @functools.wraps(func)
    async def run_with_default_executor(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        @functools.wraps(fn)
        def in_stage(*a: Any, **k: Any) -> Any:
            with stage("tokenize"):
                return fn(*a, **k)

        return await func(in_stage, *args, **kwargs)

    return run_with_default_executor


HOOKS: dict[str, Callable[[Callable], Callable]] = {"max-tokenize": max_tokenize, "max-step": max_step,
                                                   "max-model": max_model, "max-arrival": max_arrival}
