"""The api process's garbage-collector settings (`agent-engine serve`)."""

from __future__ import annotations

import gc

# Allocations between two collections of the youngest generation (Python's default: 700).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """An api process holds thousands of long-lived objects per thousand sockets, and a socket's
    handshake allocates a few thousand more: with Python's defaults the collector's older passes
    walk that whole heap again and again (bench/README.md, fanout_ws: most of a subscription's
    opening cost at 5,000 sockets). What exists once the app is built (modules, the schema)
    never dies: it is frozen out of the collector's walks, and the young generation is collected
    less often. Reference counting still frees almost everything at once; the collector is only
    there for cycles."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)
