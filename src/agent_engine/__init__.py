"""Agent Engine: personal AI agents with schedules, budgets and a run journal."""

__version__ = "0.1.0"
