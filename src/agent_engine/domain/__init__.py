"""Pure rules of the engine (docs/architecture.md §4): schedules, the start gate, the budget
window, run states.

Nothing here does I/O or reads the clock: callers pass `now` and the zone in. No SQLAlchemy,
Strawberry, Dramatiq, Redis or HTTP imports, so every rule is testable in microseconds.
"""
