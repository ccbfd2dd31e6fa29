"""`weakly`: a bound method that does not keep its object alive."""

from __future__ import annotations

import gc
import weakref

import pytest

from agent_engine.collector import weakly


class Holder:
    def __init__(self) -> None:
        self.values: list[int] = []
        self.add = weakly(self._add)  # stored on its own object: no cycle

    def _add(self, value: int) -> int:
        self.values.append(value)
        return len(self.values)


def test_it_calls_the_method_while_the_object_lives() -> None:
    holder = Holder()
    assert holder.add(3) == 1
    assert holder.add(value=4) == 2
    assert holder.values == [3, 4]


def test_its_object_is_freed_by_reference_counting_and_a_late_call_says_so() -> None:
    gc.disable()
    try:
        holder = Holder()
        add, gone = holder.add, weakref.ref(holder)
        del holder  # no cycle: freed at once, without the collector
        assert gone() is None
        with pytest.raises(ReferenceError, match=r"Holder\._add: its object is gone"):
            add(1)
    finally:
        gc.enable()
