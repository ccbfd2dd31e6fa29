"""The GraphQL API: Starlette + Strawberry (see app.py for the application factory)."""
