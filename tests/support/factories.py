"""Row factories for tests: insert real rows through SQL, return them as dicts."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_ids = itertools.count(1000)


class Factories:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def _insert(self, table: str, values: dict[str, Any]) -> dict[str, Any]:
        columns = ", ".join(values)
        params = ", ".join(
            f"CAST(:{key} AS jsonb)" if isinstance(value, (dict, list)) else f":{key}"
            for key, value in values.items()
        )
        bound = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in values.items()}
        async with self.engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        text(f"INSERT INTO {table} ({columns}) VALUES ({params}) RETURNING *"),
                        bound,
                    )
                )
                .mappings()
                .one()
            )
        return dict(row)

    async def user(self, id: int | None = None, **values: Any) -> dict[str, Any]:
        user_id = id if id is not None else next(_ids)
        values.setdefault("email", f"user{user_id}@example.com")
        values.setdefault("display_name", f"User {user_id}")
        values.setdefault("timezone", "UTC")
        return await self._insert("users", {"id": user_id, **values})

    async def model(self, **values: Any) -> dict[str, Any]:
        values.setdefault("name", "Builtin")
        values.setdefault("provider", "builtin")
        values.setdefault("model", "builtin-digest")
        values.setdefault("is_default", False)
        return await self._insert("agent_models", values)

    async def tool(
        self, name: str, *, agents_allowed: bool = True, **values: Any
    ) -> dict[str, Any]:
        values.setdefault("description", f"the {name} tool")
        return await self._insert(
            "tools", {"name": name, "agents_allowed": agents_allowed, **values}
        )

    async def agent(self, user_id: int | None = None, **values: Any) -> dict[str, Any]:
        if user_id is None:
            user_id = (await self.user())["id"]
        if "model_id" not in values:
            values["model_id"] = (await self.model())["id"]
        values.setdefault("name", "Agent")
        values.setdefault("prompt", "Summarise what changed.")
        return await self._insert("agents", {"user_id": user_id, **values})

    async def run(self, agent_id: int, **values: Any) -> dict[str, Any]:
        values.setdefault("trigger", "manual")
        values.setdefault("state", "queued")
        return await self._insert("agent_runs", {"agent_id": agent_id, **values})

    async def approval(self, run: dict[str, Any], **values: Any) -> dict[str, Any]:
        """A tool approval of `run` (a row from `run`), pending unless told; expires in a day."""
        async with self.engine.connect() as conn:
            owner_id = (
                await conn.execute(
                    text("SELECT user_id FROM agents WHERE id = :id"), {"id": run["agent_id"]}
                )
            ).scalar_one()
        values.setdefault("step_index", 1)
        values.setdefault("tool_name", "tickets__create_ticket")
        values.setdefault("expires_at", datetime.now(UTC) + timedelta(days=1))
        return await self._insert(
            "tool_approvals",
            {"run_id": run["id"], "agent_id": run["agent_id"], "owner_id": owner_id, **values},
        )

    async def setting(self, key: str, value: Any) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO platform_settings (key, value) VALUES (:k, CAST(:v AS jsonb))"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()"
                ),
                {"k": key, "v": json.dumps(value)},
            )
