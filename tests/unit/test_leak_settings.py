"""KEYSVC_LEAKED_KEY_ACTION: disable (the default) or notify; anything else is refused
in one line naming the setting."""

import pytest

from keysvc.config import ConfigError, build_settings


def test_the_action_defaults_to_disable_and_takes_notify() -> None:
    assert build_settings(env={}).leaked_key_action == "disable"
    assert build_settings(env={"KEYSVC_LEAKED_KEY_ACTION": "notify"}).leaked_key_action == "notify"
    assert build_settings({"leaked_key_action": "disable"}).leaked_key_action == "disable"


@pytest.mark.parametrize("value", ["revoke", "delete", "off", "disable,notify"])
def test_another_action_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build_settings(env={"KEYSVC_LEAKED_KEY_ACTION": value})
    assert str(refused.value) == f"leaked-key-action: {value!r} must be one of disable, notify"
