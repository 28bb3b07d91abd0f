"""tests/components.py: a missing system component skips the test that needs it, with
what to install, and fails it under CI."""

from pathlib import Path

import pytest

from tests import components
from tests.components import require_command

ABSENT = "keysvc-test-absent-command"


def test_a_present_command_is_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    assert require_command("tool", package="tool-package") == str(tool)


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_a_missing_command_skips_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_command(ABSENT, package="the-package")
    assert str(skipped.value) == (
        f"{ABSENT} is missing: install it with `sudo apt-get install the-package`"
    )


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_missing_command_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_command(ABSENT, package="the-package")
    assert str(failed.value) == (
        f"{ABSENT} is missing: install it with `sudo apt-get install the-package`"
        " (CI needs every component)"
    )


def test_a_command_in_sbin_is_found_off_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's nginx lives in /usr/sbin, off a non-root user's usual PATH."""
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    (sbin / "nginx").write_text("#!/bin/sh\n")
    (sbin / "nginx").chmod(0o755)
    monkeypatch.setattr(components, "SBIN", str(sbin))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_command("nginx", package="nginx") == str(sbin / "nginx")


def test_a_command_in_a_named_folder_is_found_off_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's initdb lives in /usr/lib/postgresql/<version>/bin, off every PATH."""
    versioned = tmp_path / "15" / "bin"
    versioned.mkdir(parents=True)
    (versioned / "initdb").write_text("#!/bin/sh\n")
    (versioned / "initdb").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_command("initdb", package="postgresql", also=str(versioned)) == str(
        versioned / "initdb"
    )
