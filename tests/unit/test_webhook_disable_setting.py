"""KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS: hours a webhook may fail every attempt before
keysvc disables it, 0 (never) to a year; anything else is refused in one line."""

import pytest

from keysvc.config import ConfigError, build_settings


def test_the_default_is_five_days() -> None:
    assert build_settings(env={}).webhook_disable_after_hours == 120


@pytest.mark.parametrize("hours", ["0", "1", "120", "8760"])
def test_hours_within_the_bound_are_taken(hours: str) -> None:
    settings = build_settings(env={"KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS": hours})
    assert settings.webhook_disable_after_hours == int(hours)


@pytest.mark.parametrize("hours", ["-1", "8761", "99999999999999"])
def test_hours_past_the_bound_are_refused(hours: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS": hours})
    assert str(caught.value) == (
        f"webhook-disable-after-hours: {hours} must be from 0 (never) to 8760 hours"
    )


@pytest.mark.parametrize("hours", ["x", "1.5", "1e3"])
def test_what_is_not_a_number_is_refused(hours: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS": hours})
    assert str(caught.value) == f"webhook-disable-after-hours: {hours!r} is not a number"
