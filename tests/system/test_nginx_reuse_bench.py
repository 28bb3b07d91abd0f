"""The bench's forward-auth scenario (bench/forward.py) runs: a tiny run of bench.run
with only it starts the file server, the four nginx fronts (no auth, auth_basic, and
the shipped auth_request config with reuse off and on) and two `keysvc serve`, every
request through each front answers 200, and it writes its own section."""

import re
from pathlib import Path

import pytest

from bench import forward, run
from bench.seed import Credential
from tests.components import require_command


def test_a_tiny_forward_auth_run_writes_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_command("nginx", package="nginx")
    require_command("wrk", package="wrk")
    require_command("hey", package="hey")
    doc = tmp_path / "PERFORMANCE.md"
    argv = ["--only", forward.NAME, "--rounds", "1", "--seconds", "1", "--warmup", "0"]
    argv += ["--forward-keys", "5", "--doc", str(doc)]
    assert run.main(argv) == 0  # no setup answered more than 1% non-2xx
    # Each round says what a request cost each front's nginx worker in CPU time.
    rounds = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("bench:   round 1/1:")
    ]
    assert len(rounds) == 1
    for label in ("basic", "static", "verify", "reuse"):
        assert re.search(rf"{label} [0-9,]+ req/s \([0-9]+ us CPU\)", rounds[0]), rounds[0]
    text = doc.read_text()
    assert "<!-- bench:main -->" not in text  # only the scenario asked for ran
    section = text.split("<!-- bench:forward -->")[1].split("<!-- /bench:forward -->")[0]
    assert "## Forward auth: nginx auth_basic vs auth_request to keysvc" in section
    assert "| basic req/s | static req/s | verify req/s | reuse req/s |" in section
    assert (
        "- target: with reuse, at least 0.70 of `auth_basic`'s requests/s: reuse/basic" in section
    )
    assert "| paced rate | basic req/s | reuse req/s |" in section


def test_the_htpasswd_file_holds_each_key_as_sha() -> None:
    made = forward.htpasswd([Credential("k1", "i1", "secret")])
    assert made == "i1:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\n"
