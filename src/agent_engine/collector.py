"""The garbage-collector settings of the api and worker processes, and `weakly`, which keeps an
object that holds its own methods out of a reference cycle."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# Allocations between two collections of the youngest generation (Python's default: 700).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """An api process holds thousands of long-lived objects per thousand sockets, and a socket's
    handshake allocates a few thousand more; a worker holds hundreds of runs in flight. With
    Python's defaults the collector walks those again and again, finding next to nothing
    (bench/README.md, fanout_ws: most of a subscription's opening cost at 5,000 sockets; the
    stampede: ~0.2 ms per run, 70 objects collected in 500 runs). What exists once the process
    is up (modules, the schema) never dies: it is frozen out of the collector's walks, and the
    young generation is collected less often. Reference counting still frees almost everything
    at once; the collector is only there for cycles."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


def weakly(method: Callable[P, R]) -> Callable[P, R]:
    """A bound method that does not keep its object alive.

    An object that stores its own bound methods (graphql-core's executor keeps two in its
    resolve-info helpers) is a reference cycle, and everything it holds — a request's context,
    its loaders, their cached rows — is then freed by the collector instead of by reference
    counting. A page left ~570 such objects, and the young generation's collections cost ~0.7 ms
    per page (bench/README, "CPU per unit of work"). Called after its object is gone, it raises
    ReferenceError.
    """
    ref = weakref.WeakMethod(method)
    name = method.__qualname__  # not the method: it holds its object

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = ref()
        if bound is None:
            raise ReferenceError(f"{name}: its object is gone")
        return bound(*args, **kwargs)

    return call
