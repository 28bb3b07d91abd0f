"""Every curl example in the README and in the docs site's pages (docs/**/*.md) runs as
written against a real server: a ```sh block with a line that starts with curl or http,
wherever it is (a page's admonition or tab indents it: it runs dedented)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from keysvc.config import OPTIONS, build_settings
from tests.components import require_command
from tests.server import Server, bootstrap

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"
# A ```sh fence and its block, at any indentation (the closing fence at the same).
FENCE = re.compile(r"^([ \t]*)```sh\n(.*?)^\1```", re.S | re.M)


def examples(text: str) -> list[str]:
    """The runnable examples in a Markdown text: its ```sh blocks with a curl or http
    line, dedented."""
    blocks = [textwrap.dedent(block) for _, block in FENCE.findall(text)]
    return [block for block in blocks if re.search(r"^(curl|http) ", block, re.M)]


def named(block: str) -> str:
    return block.split("\n")[0][:40]


# The README's as before (named by their first line), then each docs page's (named by
# the page too).
BLOCKS = [pytest.param(block, id=named(block)) for block in examples(README.read_text())]
BLOCKS += [
    pytest.param(block, id=f"{page.relative_to(README.parent)}:{named(block)}")
    for page in sorted(DOCS.rglob("*.md"))
    for block in examples(page.read_text())
]


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


def test_the_docs_pages_examples_are_run_too() -> None:
    assert [param for param in BLOCKS if str(param.id).startswith("docs/")]


def test_an_indented_example_is_found_and_dedented() -> None:
    page = '!!! example\n    ```sh\n    curl -s "$BASE/healthz"\n    ```\n```sh\nls\n```\n'
    assert examples(page) == ['curl -s "$BASE/healthz"\n']


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    db = tmp_path_factory.mktemp("readme") / "keysvc.db"
    created = bootstrap(db)
    # httpie reads a stdin that is not a terminal as the request body; in a terminal,
    # as the README is meant to be used, it does not. This config stands in for that.
    httpie = tmp_path_factory.mktemp("httpie")
    (httpie / "config.json").write_text(json.dumps({"default_options": ["--ignore-stdin"]}))
    # The import example sends a token hash, which the API takes only when told to.
    with Server(db, env={"KEYSVC_API_TOKEN_IMPORT": "1"}) as running:
        env = {
            "BASE": running.base,
            "ORG": created["organizationId"],
            "KEY_ID": created["keyId"],
            "KEY_SECRET": created["keySecret"],
            "KEY": created["id"],
            "HTTPIE_CONFIG_DIR": str(httpie),
            # The project's own tools (http) first, as in an activated .venv.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        yield env
        running.stop()


@pytest.mark.parametrize("block", BLOCKS)
def test_curl_example_works_as_written(server: dict[str, str], block: str) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        capture_output=True,
        text=True,
        # The httpie block starts seven interpreters (8 s on a quiet machine): 30 s was
        # not enough with every core busy.
        timeout=90,
        env={**os.environ, **server},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = [value for value in envelopes(done.stdout) if isinstance(value, dict)]
    # Each curl line whose output is not piped prints one envelope; piped lines are
    # checked by their own `jq -e` and pipefail.
    printed = sum(
        1 for line in block.splitlines() if line.startswith(("curl ", "http ")) and "|" not in line
    )
    assert len(answers) == printed
    for answer in answers:
        assert answer["status"] == 200, answer


def test_the_nginx_page_includes_the_configuration_that_is_tested() -> None:
    """The page shows docs/nginx-auth-request.conf itself (included at build time, so
    there is no copy to keep in step; tests/system/test_docs_site.py checks the built
    page), and the README holds no copy."""
    page = (DOCS / "forward-auth" / "nginx.md").read_text()
    shown = re.findall(r"```nginx\n(.*?)```", page, re.S)
    assert shown == ['--8<-- "docs/nginx-auth-request.conf"\n']
    assert "```nginx" not in README.read_text()


def test_systemd_unit_uses_only_settings_keysvc_knows() -> None:
    unit = (README.parent / "docs" / "keysvc.service").read_text()
    env = dict(re.findall(r"^Environment=(KEYSVC_\w+)=(.*)$", unit, re.M))
    assert env and set(env) <= {option.env for option in OPTIONS}
    settings = build_settings(env=env)
    assert str(settings.db_path).startswith("/var/lib/keysvc/")  # the StateDirectory
    assert "StateDirectory=keysvc" in unit
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    assert exec_start.split()[-2:] == ["/opt/keysvc/keysvc.pyz", "serve"]
    assert "KillSignal=SIGTERM" in unit


def test_systemd_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    """The unit is valid for systemd, and its hardening rates "OK": an exposure of at most
    1.3 as printed (the threshold counts on a 0 to 100 scale): 1.2 today (systemd 252),
    and dropping any one of ProtectHome, CapabilityBoundingSet or PrivateDevices fails."""
    unit = tmp_path / "keysvc.service"
    shutil.copyfile(README.parent / "docs" / "keysvc.service", unit)
    analyze = require_command("systemd-analyze", package="systemd")
    verify = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=13", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert security.returncode == 0, security.stdout + security.stderr
