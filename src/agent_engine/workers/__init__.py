"""Dramatiq: the broker (the one place that sets it), thin actors, worker and clock processes."""
