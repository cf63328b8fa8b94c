"""Named presets of ``--stage`` wrap points, and the hooks that wraps with logic use.

A preset is a list of ``--stage`` specs for a framework's own code: ``maxinstr run --preset max``
(applied by itself when the command is MAX's: `max generate`, `max serve`, ``python -m
max.entrypoints...``; ``--no-preset`` turns that off). The specs travel to every process of the
run as any ``--stage`` does (``MAXINSTR_STAGES``), are applied when their module is imported, and
a spec that no process applied is said at the end of the run.

Most specs wrap a function in a stage of the given name. A spec whose name is ``@HOOK`` wraps it
with one of the hooks below instead, for wrap points that need logic: a pipeline step that is a
prefill or a decode depending on its batch (``@max-step``), the architecture's model found on the
pipeline at run time (``@max-model``), a request's arrival as a mark (``@max-arrival``). Only the
hooks of :data:`HOOKS` exist: a spec names one, never code of its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maxinstr.integrations import max_pipeline


@dataclass(frozen=True)
class Preset:
    name: str
    specs: tuple[str, ...]
    env: Mapping[str, str]  # set in the program's environment unless the user set it (why: in the docs)
    what: str
    applies_to: str  # the commands that get it without --preset

    def plan_line(self) -> str:
        env = "".join(f", {k}={v}" for k, v in self.env.items())
        return f"preset {self.name}: {len(self.specs)} wrap points in {self.what}{env} (by itself for {self.applies_to}; --no-preset: not)"


PRESETS: dict[str, Preset] = {
    "max": Preset(
        name="max",
        specs=tuple(p.spec for p in max_pipeline.WRAP_POINTS),
        # telemetry off: no telemetry process, exporter threads or metrics server beside the
        # program being measured, and nothing sent out (a machine without network would retry)
        env={max_pipeline.TELEMETRY_VARIABLE: "1"},
        what=f"MAX {max_pipeline.MAX_RELEASE}'s pipelines (tokenize, prefill, decode, forward, sample, graph, load, compile)",
        applies_to="MAX's commands",
    ),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; MaxinstrError naming the known ones otherwise."""
    from maxinstr.errors import MaxinstrError

    try:
        return PRESETS[name]
    except KeyError:
        raise MaxinstrError(f"--preset {name!r}: no such preset (known: {', '.join(sorted(PRESETS))})") from None


def recorded_specs(launch: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(--stage specs given, presets)`` of a run as launch.json recorded them (its
    ``stage_specs`` holds the presets' specs too): to run the program again as it ran. A preset
    counts only where every spec of it is among the recorded ones."""
    recorded = {t for t in (launch.get("stage_specs") or []) if isinstance(t, str)}
    names = [n for n in (launch.get("presets") or []) if isinstance(n, str) and n in PRESETS
             and set(PRESETS[n].specs) <= recorded]
    from_presets = {text for name in names for text in PRESETS[name].specs}
    return [t for t in (launch.get("stage_specs") or []) if isinstance(t, str) and t not in from_presets], names


def auto_presets(command: Sequence[str]) -> list[str]:
    """The presets a command gets without asking: ``max`` for MAX's own entry points."""
    return ["max"] if max_pipeline.is_max_command(command) else []


# ---------------------------------------------------------------------------------------
# Hooks: a spec ``MODULE:QUALNAME=@HOOK`` wraps QUALNAME with HOOKS[HOOK](func). Each returns a
# function of the same kind (plain or async) that calls func exactly once, and never lets a
# problem of its own reach the program (they run inside the program's calls).


def _stage() -> Callable[..., Any]:
    from maxinstr.record import stage

    return stage


def _mark() -> Callable[..., Any]:
    from maxinstr.record import mark

    return mark


def _inputs_arg(args: tuple, kwargs: dict) -> Any:
    return kwargs["inputs"] if "inputs" in kwargs else args[0] if args else None


def max_step(func: Callable) -> Callable:
    """A pipeline's ``execute(inputs)``: in a stage ``prefill``, ``decode`` or ``drain`` with the
    batch's attrs (:func:`maxinstr.integrations.max_pipeline.step_stage`)."""
    stage = _stage()

    @functools.wraps(func)
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        name, attrs = max_pipeline.step_stage(_inputs_arg(args, kwargs))
        with stage(name, **attrs):
            return func(self, *args, **kwargs)

    return execute


def max_model(func: Callable) -> Callable:
    """A pipeline's ``__init__``: once it has run, the class of the pipeline's model (the
    architecture's: ``Llama3Model``) gets its ``execute`` wrapped in a stage ``forward``, as a
    ``--stage`` spec applied now (recorded like the others; one line if it cannot be)."""

    @functools.wraps(func)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        func(self, *args, **kwargs)
        spec, problem = max_pipeline.model_execute_spec(self)
        _apply_found(spec, problem, type(self).__qualname__)

    return __init__


def _apply_found(spec: str | None, problem: str | None, where: str) -> None:
    import sys

    from maxinstr.launch.instrument import instrument

    try:
        if spec is not None:
            instrument(spec, lazy=True)  # its module is imported: applied now, or one line said
        else:
            sys.stderr.write(f"maxinstr: --stage @max-model ({where}): no forward stage: {problem}\n")
    except Exception as exc:  # noqa: BLE001 - inside MAX's constructor: never break it
        sys.stderr.write(f"maxinstr: --stage @max-model ({where}): {type(exc).__name__}: {exc}\n")


def max_arrival(func: Callable) -> Callable:
    """A tokenizer's ``new_context(request)``: once the request's context is made, a mark
    ``queued`` with the attr ``request`` (its id): the start of its wait for a first step."""
    mark = _mark()

    def said(context: Any) -> Any:
        try:
            mark(max_pipeline.QUEUED_MARK, request=max_pipeline.request_key(context))
        except Exception:  # noqa: BLE001 - a mark that fails must not lose the request
            pass
        return context

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def new_context(*args: Any, **kwargs: Any) -> Any:
            return said(await func(*args, **kwargs))

        return new_context

    @functools.wraps(func)
    def new_context_sync(*args: Any, **kwargs: Any) -> Any:
        return said(func(*args, **kwargs))

    return new_context_sync


def max_tokenize(func: Callable) -> Callable:
    """MAX's ``run_with_default_executor(fn, *args)``, the tokenizer's way of running its work
    (encode, the chat template) in a thread pool: ``fn`` runs in a stage ``tokenize`` on the pool's
    thread. A stage around the awaiting coroutine instead would open on the event loop's thread,
    where a server's concurrent requests interleave: each would nest inside the one before."""
    if not inspect.iscoroutinefunction(func):
        from maxinstr.errors import MaxinstrError

        raise MaxinstrError(f"@max-tokenize: {func.__qualname__} is not a coroutine function (MAX {max_pipeline.MAX_RELEASE}'s was)")
    stage = _stage()

    @functools.wraps(func)
    async def run_with_default_executor(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        @functools.wraps(fn)
        def in_stage(*a: Any, **k: Any) -> Any:
            with stage("tokenize"):
                return fn(*a, **k)

        return await func(in_stage, *args, **kwargs)

    return run_with_default_executor


HOOKS: dict[str, Callable[[Callable], Callable]] = {
    "max-tokenize": max_tokenize,
    "max-step": max_step,
    "max-model": max_model,
    "max-arrival": max_arrival,
}


def hook_factory(hook: str) -> Callable[[Callable], Callable]:
    """The decorator for a spec named ``@hook`` (instrument.py calls this at wrap time)."""
    return HOOKS[hook]
