"""`@maxinstr.stage(...)` as a decorator (``Stage.__call__`` -> :func:`wrap`): a fresh stage per
call of a plain or ``async`` function, and per *resumption* of a generator or async generator (from
resuming the body until it yields, returns or raises). A stage around a generator's whole lifetime
would hold its consumer's work between yields; per-resumption stages are exactly the body's time,
always nest, and a generator abandoned half-way leaves nothing open. The wrapper keeps the
function's name, signature, docstring and kind (``inspect`` still sees a coroutine function).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import maxinstr._native as _native

F = TypeVar("F", bound=Callable[..., Any])


def wrap(st: Any, func: F) -> F:
    """Return `func` wrapped so each call (or resumption) runs inside a fresh copy of `st`."""
    name, kw = st._spec()
    make = _native.stage

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
            agen = func(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            suspended = False  # the body is paused at a yield (so closing it runs its cleanup)
            try:
                while True:
                    with make(name, **kw):
                        try:
                            value = await (agen.asend(sent) if thrown is None else agen.athrow(thrown))
                            thrown, suspended = None, True
                        except StopAsyncIteration:
                            suspended = False
                            return
                        except BaseException:
                            suspended = False
                            raise
                    try:
                        sent = yield value
                    except GeneratorExit:
                        raise
                    except BaseException as e:  # noqa: BLE001 - thrown into us: forward to the body
                        thrown = e
            finally:
                if suspended:
                    with make(name, **kw):
                        await agen.aclose()

        return agen_wrapper  # type: ignore[return-value]

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def coro_wrapper(*args: Any, **kwargs: Any) -> Any:
            with make(name, **kw):
                return await func(*args, **kwargs)

        return coro_wrapper  # type: ignore[return-value]

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            gen = func(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            started = False
            try:
                while True:
                    with make(name, **kw):
                        try:
                            value = gen.send(sent) if thrown is None else gen.throw(thrown)
                            thrown, started = None, True
                        except StopIteration as stop:
                            started = False
                            return stop.value
                        except BaseException:
                            started = False
                            raise
                    try:
                        sent = yield value
                    except GeneratorExit:
                        raise
                    except BaseException as e:  # noqa: BLE001 - thrown into us: forward to the body
                        thrown = e
            finally:
                # Closed half-way (abandoned, or close()): run the body's cleanup in a stage.
                if started and gen.gi_frame is not None:
                    with make(name, **kw):
                        gen.close()

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with make(name, **kw):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
