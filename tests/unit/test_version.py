"""keysvc's version, written in one place (``keysvc.__version__``): what ``keysvc
--version`` prints, what the installed package says, and where it stands against
CHANGELOG.md's versions."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import keysvc
from keysvc.cli import main

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(\.dev\d+)?$")


def test_keysvc_version_prints_the_package_s_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"keysvc {keysvc.__version__}\n"


def test_the_command_prints_it_too() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keysvc", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"keysvc {keysvc.__version__}\n", "")


def test_the_installed_package_has_the_same_version() -> None:
    """pyproject.toml reads it from keysvc.__version__ (make install again after a bump)."""
    assert importlib.metadata.version("keysvc") == keysvc.__version__


def test_the_changelog_s_versions_lead_to_this_one() -> None:
    """Keep a Changelog: Unreleased first, then each release, newest first, with its
    date; a .dev version is the next one after the newest release, a release is it."""
    headings = [
        line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")
    ]
    assert headings[0] == "## [Unreleased]"
    releases = []
    for heading in headings[1:]:
        found = RELEASE.match(heading)
        assert found, heading
        releases.append(((int(found[1]), int(found[2]), int(found[3])), found[4]))
    assert releases == sorted(releases, reverse=True)
    ours = VERSION.match(keysvc.__version__)
    assert ours, keysvc.__version__
    newest = releases[0][0]
    number = (int(ours[1]), int(ours[2]), int(ours[3]))
    assert number > newest if ours[4] else number == newest
