from zoneinfo import ZoneInfo

from agent_engine.domain.zones import user_zone_name, zone_or_utc


def test_a_user_without_a_zone_of_their_own_lives_in_the_platforms() -> None:
    assert user_zone_name(None, "Europe/Berlin") == "Europe/Berlin"
    assert user_zone_name("", "Europe/Berlin") == "Europe/Berlin"
    assert user_zone_name("America/New_York", "Europe/Berlin") == "America/New_York"


def test_an_unreadable_stored_zone_falls_back_to_utc_instead_of_failing() -> None:
    assert zone_or_utc("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    assert zone_or_utc("Mars/Olympus_Mons") == ZoneInfo("UTC")
    assert zone_or_utc("../etc/passwd") == ZoneInfo("UTC")
    assert zone_or_utc(None) == ZoneInfo("UTC")
