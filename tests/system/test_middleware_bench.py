"""The bench's middleware scenario (bench/middleware.py) runs: a tiny run of bench.run
with only it starts keysvc and the two hello-world services (with and without
keysvc.client's middleware), every request through each answers 200, and it writes
its own section with the ratio and the revocation measured through the middleware."""

from pathlib import Path

from bench import middleware, run
from tests.components import require_command


def test_a_tiny_middleware_run_writes_its_section(tmp_path: Path) -> None:
    require_command("wrk", package="wrk")
    doc = tmp_path / "PERFORMANCE.md"
    argv = ["--only", middleware.NAME, "--rounds", "1", "--seconds", "1", "--warmup", "0"]
    assert run.main([*argv, "--doc", str(doc)]) == 0  # no app answered more than 1% non-2xx
    text = doc.read_text()
    assert "<!-- bench:main -->" not in text  # only the scenario asked for ran
    section = text.split("<!-- bench:middleware -->")[1].split("<!-- /bench:middleware -->")[0]
    assert "### The middleware: a Python service verifying with keysvc.client" in section
    assert "auth/plain: **" in section
    # Revocation through the middleware: every request after the first refusal refused.
    assert "- revocation: 5 keys disabled through the API" in section
    assert "- hit and miss apart: one round each" in section and "plain/auth by CPU" in section
    assert "200s after a refusal 0" in section
