"""A changed `zoneinfo` claim moves the owner's calendar slots in the same request."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.integration.api.support import FIXED_NOW, Api
from tests.support.factories import Factories

OWNER = 77
NEXT = "query($a: ID!) { agent(id: $a) { nextRunAt upcomingRunTimes(limit: 2) } }"


async def test_a_zone_change_moves_calendar_slots_but_not_interval_slots(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER, timezone="Europe/Berlin")
    model = await factories.model()
    # 09:00 in Berlin fired today at 08:00 UTC; the next slot is tomorrow 09:00 Berlin.
    daily = await factories.agent(
        user_id=OWNER,
        model_id=model["id"],
        schedule={"type": "calendar", "cadence": "daily", "time": "09:00"},
        next_run_at=datetime(2025, 3, 13, 8, 0, tzinfo=FIXED_NOW.tzinfo),
    )
    await factories.run(
        daily["id"],
        trigger="scheduled",
        state="succeeded",
        created_at=datetime(2025, 3, 12, 8, 0, tzinfo=FIXED_NOW.tzinfo),
        finished_at=datetime(2025, 3, 12, 8, 1, tzinfo=FIXED_NOW.tzinfo),
    )
    interval_slot = FIXED_NOW + timedelta(hours=5)
    interval = await factories.agent(
        user_id=OWNER,
        model_id=model["id"],
        schedule={"type": "interval", "every_hours": 6},
        next_run_at=interval_slot,
    )
    berlin = api.token(OWNER, timezone="Europe/Berlin")
    new_york = api.token(OWNER, timezone="America/New_York")
    unchanged = (await api.data(NEXT, {"a": str(daily["id"])}, token=berlin))["agent"]
    assert unchanged["nextRunAt"] == "2025-03-13T08:00:00+00:00"

    moved = (await api.data(NEXT, {"a": str(daily["id"])}, token=new_york))["agent"]

    # 09:00 New York (EDT) -- tomorrow, not today at 13:00 UTC: that local day already had its
    # run (04:00 New York time, under the old zone).
    assert moved == {
        "nextRunAt": "2025-03-13T13:00:00+00:00",
        "upcomingRunTimes": ["2025-03-13T13:00:00+00:00", "2025-03-14T13:00:00+00:00"],
    }
    kept = (await api.data(NEXT, {"a": str(interval["id"])}, token=new_york))["agent"]
    assert kept["nextRunAt"] == interval_slot.isoformat()
