"""Logs and metrics shared by every process."""
