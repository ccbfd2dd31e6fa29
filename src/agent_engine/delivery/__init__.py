"""Delivering finished runs to admin-approved webhooks, signed per Standard Webhooks."""
