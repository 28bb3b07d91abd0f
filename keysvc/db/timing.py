"""How long each data-layer call takes, for metrics: the ``timed`` decorator and the
``Observer`` it reports to."""

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

# Told the name and duration in seconds of every store call, for metrics.
Observer = Callable[[str, float], None]
_P = ParamSpec("_P")
_T = TypeVar("_T")


class Observed(Protocol):
    observer: Observer | None


_O = TypeVar("_O", bound=Observed)


def timed(
    method: Callable[Concatenate[_O, _P], Awaitable[_T]],
) -> Callable[Concatenate[_O, _P], Awaitable[_T]]:
    """Report the call's duration, waiting for the write lock included, to the observer."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: _O, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        observer = self.observer
        if observer is None:
            return await method(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return await method(self, *args, **kwargs)
        finally:
            observer(name, time.perf_counter() - started)

    return wrapper
