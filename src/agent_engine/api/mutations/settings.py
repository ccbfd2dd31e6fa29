"""The platform settings (admin only): every change goes through one audited path."""

from __future__ import annotations

from typing import Any

import strawberry

from agent_engine.agents import admin as admin_service
from agent_engine.agents import admin_rules
from agent_engine.api.errors import BadUserInput
from agent_engine.api.guards import PLATFORM_PROMPT_MAX_CHARS, checked_text
from agent_engine.api.inputs import PlatformSettingsInput
from agent_engine.api.mutations.common import transaction
from agent_engine.api.mutations.validation import zone_name
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.types.catalog import PlatformSettings
from agent_engine.db.platform import load_platform_settings
from agent_engine.domain.budget import AlertPercentsError, parse_alert_percents
from agent_engine.domain.money import MoneyError, parse_currency


@strawberry.type
class SettingsMutation:
    @described_mutation(description="Admin only.")
    async def update_platform_settings(
        self, info: Info, input: PlatformSettingsInput
    ) -> PlatformSettings:
        viewer = info.context.require_admin()
        changes: dict[str, Any] = {}
        if input.weekly_token_cap is not strawberry.UNSET:
            cap = input.weekly_token_cap
            if problem := admin_rules.weekly_token_cap_problem(cap):
                raise BadUserInput("input.weeklyTokenCap", problem)
            changes["weekly_token_cap"] = cap
        if input.timezone is not strawberry.UNSET:
            changes["timezone"] = zone_name("input.timezone", input.timezone)
        if input.platform_prompt is not strawberry.UNSET:
            changes["platform_prompt"] = checked_text(
                "input.platformPrompt",
                input.platform_prompt or "",
                PLATFORM_PROMPT_MAX_CHARS,
                allow_blank=True,
            )
        if input.iteration_cap is not strawberry.UNSET:
            iteration_cap = input.iteration_cap
            if problem := admin_rules.iteration_cap_problem(iteration_cap):
                raise BadUserInput("input.iterationCap", problem)
            changes["iteration_cap"] = iteration_cap
        if input.currency is not strawberry.UNSET:
            if input.currency is None:
                raise BadUserInput("input.currency", "cannot be null")
            try:
                changes["currency"] = parse_currency(input.currency)
            except MoneyError as exc:
                raise BadUserInput("input.currency", str(exc)) from exc
        if input.budget_alert_percents is not strawberry.UNSET:
            if input.budget_alert_percents is None:
                raise BadUserInput(
                    "input.budgetAlertPercents", "cannot be null; an empty list records no alerts"
                )
            try:
                changes["budget_alert_percents"] = list(
                    parse_alert_percents(input.budget_alert_percents)
                )
            except AlertPercentsError as exc:
                raise BadUserInput("input.budgetAlertPercents", str(exc)) from exc
        # Settings changes (currency and alert thresholds included) go through the one
        # update_platform_settings path, where they can be audited as a whole.
        if input.run_retention_days is not strawberry.UNSET:
            days = input.run_retention_days
            if problem := admin_rules.retention_days_problem(days):
                raise BadUserInput("input.runRetentionDays", problem)
            changes["run_retention_days"] = days
        async with transaction(info) as conn:
            await admin_service.update_platform_settings(
                conn, changes, actor_id=viewer.user_id, now=info.context.now
            )
            current = await load_platform_settings(conn)
        # A later field of the same document (a user's zone, a budget) sees the new settings.
        info.context.loaders.forget_platform()
        return PlatformSettings.from_value(current)
