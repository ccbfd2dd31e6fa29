"""Benchmarks of Agent Engine against its limits: `python -m bench [--quick]`.

Every scenario measures the engine and a bare baseline in the same process, seconds apart, and
reports the ratio, because the machine is shared and noisy. See bench/README.md.
"""

# Scenario modules, in the order they run (and in order of priority).
SCENARIOS = (
    "scheduler_tick",
    "run_pipeline",
    "budget_gate",
    "graphql_page",
    "fanout",
    "fanout_ws",
    "recovery",
    "stampede",
    "retention",
    "mcp_call",
    "owner_oauth_call",
    "hostile",
    "fallback",
    "tracing",
)
