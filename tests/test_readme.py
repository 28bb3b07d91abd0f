"""Every curl example in the README runs as written against a real server."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.server import Server, bootstrap

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = [b for b in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S) if "curl " in b]


def envelopes(output: str) -> list[object]:
    """The JSON values printed, in order; other text (headers, plain lines) is skipped."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(output):
        if output[at].isspace():
            at += 1
            continue
        try:
            value, at = decoder.raw_decode(output, at)
        except json.JSONDecodeError:
            newline = output.find("\n", at)
            at = len(output) if newline < 0 else newline + 1
            continue
        found.append(value)
    return found


def test_readme_has_curl_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    db = tmp_path_factory.mktemp("readme") / "keysvc.db"
    created = bootstrap(db)
    with Server(db) as running:
        env = {
            "BASE": running.base,
            "ORG": created["organizationId"],
            "KEY_ID": created["keyId"],
            "KEY_SECRET": created["keySecret"],
            "KEY": created["id"],
        }
        yield env
        running.stop()


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.split("\n")[0][:40])
def test_curl_example_works_as_written(server: dict[str, str], block: str) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **server},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = [value for value in envelopes(done.stdout) if isinstance(value, dict)]
    # Each curl line whose output is not piped prints one envelope; piped lines are
    # checked by their own `jq -e` and pipefail.
    printed = sum(1 for line in block.splitlines() if line.startswith("curl ") and "|" not in line)
    assert len(answers) == printed
    for answer in answers:
        assert answer["status"] == 200, answer


def test_readme_shows_the_nginx_configuration_that_is_tested() -> None:
    shown = re.findall(r"```nginx\n(.*?)```", README.read_text(), re.S)
    tested = (README.parent / "docs" / "nginx-auth-request.conf").read_text()
    assert shown == [tested.rstrip() + "\n"]
