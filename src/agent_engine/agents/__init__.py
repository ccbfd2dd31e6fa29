"""Agent definitions: writes of agents, their tool selection, and the admin's catalog.

Callers (the API) check who may do what and validate input shapes; these functions hold the rules
that touch the database: the default model, allowed tools, and `next_run_at` recomputed whenever the
gate may have opened or the schedule changed (the database trigger clears it when the gate closes).
"""
