"""Settings that must be refused in one line: a number of server processes past what one
machine serves, and numbers written in any digits but ASCII ones (``int()`` alone takes
Arabic-Indic digits, ``1_000`` and surrounding spaces)."""

import pytest

from keysvc.config import MAX_WORKERS, ConfigError, build_settings


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KEYSVC_WORKERS": "100000"}, f"workers: 100000 must be from 1 to {MAX_WORKERS}"),
        ({"KEYSVC_WORKERS": "0"}, f"workers: 0 must be from 1 to {MAX_WORKERS}"),
        (
            {"KEYSVC_PORT": "\u0668\u0660\u0668\u0660"},
            "port: '\u0668\u0660\u0668\u0660' is not a number",
        ),
        ({"KEYSVC_PORT": "8_080"}, "port: '8_080' is not a number"),
        ({"KEYSVC_PORT": " 8080"}, "port: ' 8080' is not a number"),
        ({"KEYSVC_PORT": "+8080"}, "port: '+8080' is not a number"),
        ({"KEYSVC_WORKERS": "\uff12"}, "workers: '\uff12' is not a number"),  # full-width 2
        ({"KEYSVC_CACHE_SIZE": "\u0661\u0660"}, "cache-size: '\u0661\u0660' is not a number"),
        ({"KEYSVC_MAX_KEYS_PER_ORG": "\u00b2"}, "max-keys-per-org: '\u00b2' is not a number"),
        (
            {"KEYSVC_THROTTLE_PREFIX_V4": "\u0663\u0662"},
            "throttle-prefix-v4: '\u0663\u0662' is not a number",
        ),
        (
            {"KEYSVC_USAGE_RETENTION_DAYS": "\u0663\u0660"},
            "usage-retention-days: '\u0663\u0660' is not a number",
        ),
        (
            {"KEYSVC_RATE_LIMIT": "\u0661\u0660\u0660/10s"},
            "rate-limit: '\u0661\u0660\u0660/10s' is not a limit such as 100/10s, 1000/m or off",
        ),
        (
            {"KEYSVC_UNIX_GROUP": "\u0661\u0660"},
            "unix-group: '\u0661\u0660' is no group on this machine",
        ),
        (
            {"KEYSVC_WEBHOOK_TIMEOUT": "\u0661\u0660"},
            "webhook-timeout: '\u0661\u0660' is not a number of seconds",
        ),
    ],
)
def test_malformed_numbers_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env=env)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({"KEYSVC_WORKERS": "64"}, "workers", 64),
        ({"KEYSVC_WORKERS": "1"}, "workers", 1),
        ({"KEYSVC_PORT": "0"}, "port", 0),
        ({"KEYSVC_PORT": "08080"}, "port", 8080),
        ({"KEYSVC_UNIX_GROUP": "0"}, "unix_group", 0),
        ({"KEYSVC_WEBHOOK_TIMEOUT": "2.5"}, "webhook_timeout", 2.5),
        ({"KEYSVC_RATE_LIMIT": "100/10s"}, "rate_limit", (100, 10)),
    ],
)
def test_ascii_numbers_within_bounds_are_taken(
    env: dict[str, str], field: str, value: object
) -> None:
    assert getattr(build_settings(env=env), field) == value
