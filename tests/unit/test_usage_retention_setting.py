"""KEYSVC_USAGE_RETENTION_DAYS is bounded: a value the prune's date arithmetic
cannot take is refused by the settings loader, in one line that says what to give."""

import pytest

from keysvc.config import ConfigError, build_settings

# The bound docs/operations/configuration.md documents.
MAX_USAGE_RETENTION_DAYS = 3650


@pytest.mark.parametrize("days", ["1", "30", str(MAX_USAGE_RETENTION_DAYS)])
def test_retentions_within_the_bound_are_taken(days: str) -> None:
    settings = build_settings(env={"KEYSVC_USAGE_RETENTION_DAYS": days})
    assert settings.usage_retention_days == int(days)


@pytest.mark.parametrize(
    "days", [str(MAX_USAGE_RETENTION_DAYS + 1), "1000000", "999999999999", "0", "-5"]
)
@pytest.mark.parametrize("given", ["env", "flag"])
def test_retentions_past_the_bound_are_refused(days: str, given: str) -> None:
    with pytest.raises(ConfigError) as caught:
        if given == "env":
            build_settings(env={"KEYSVC_USAGE_RETENTION_DAYS": days})
        else:
            build_settings({"usage_retention_days": days}, env={})
    assert str(caught.value) == (
        f"usage-retention-days: {days} must be from 1 to {MAX_USAGE_RETENTION_DAYS} days"
        " (ten years)"
    )
