"""The run lifecycle: request, schedule tick, execute with heartbeat, reap."""
