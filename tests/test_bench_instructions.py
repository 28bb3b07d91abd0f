"""bench/instructions.py: callgrind's counts read from its dumps, the table, and a
real count of a real server under callgrind that grows with the requests sent."""

import json
import os
import urllib.request
from pathlib import Path

import pytest

from bench import instructions
from bench.baseline import ROUTES, Shape
from bench.scenarios import BY_NAME
from bench.servers import start_baseline
from tests.components import require_command

SHAPE = Shape(200, {"Content-Type": "application/json; charset=utf-8"}, b'{"status": 200}')


def test_a_dumps_count_is_its_totals_line_once_written() -> None:
    head = b"version: 1\ncmd: python\nevents: Ir\nsummary: 123456\n\nfn=main\n1 5\n"
    assert instructions.dump_total(head + b"\ntotals: 123456\n") == 123456
    assert instructions.dump_total(head) is None  # the head only: still being written
    assert instructions.dump_total(head + b"\ntotals: 1234") is None  # the line cut short


def test_a_refused_control_command_is_an_error(tmp_path: Path) -> None:
    """callgrind_control exits 0 even when no callgrind runs under the pid it is given."""
    valgrind = require_command("valgrind", package="valgrind")
    callgrind = instructions.Callgrind(valgrind, tmp_path / "cg")
    with pytest.raises(RuntimeError, match="callgrind_control --zero"):
        callgrind.control(os.getpid(), "--zero")  # this test's own process: no callgrind


def test_the_table_gives_instructions_per_request_and_a_over_each_app() -> None:
    counts = {
        ("verify", "A"): instructions.Count(2_000_000, 10),
        ("verify", "B"): instructions.Count(8_000_000, 10, failures=1),
    }
    text = instructions.table([BY_NAME["verify"]], ["A", "B"], counts)
    header, rule, row = text.splitlines()
    assert header == "| scenario | A instr/req | B instr/req | A/B | A requests | B requests |"
    assert rule.count("---") == 6
    assert row == (
        "| GET /v1/verify, rotating keys | 200,000 | 800,000 | 0.25 | 10 | 10 (1 failed) |"
    )


def _get(base: str, times: int) -> None:
    for _ in range(times):
        with urllib.request.urlopen(base + "/v1/verify", timeout=60) as answer:
            assert answer.status == 200


def test_a_server_under_callgrind_counts_more_for_more_requests(tmp_path: Path) -> None:
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({name: SHAPE.as_json() for name in ROUTES}))
    valgrind = require_command("valgrind", package="valgrind")
    callgrind = instructions.Callgrind(valgrind, tmp_path / "cg")
    with start_baseline(shapes, tmp_path / "a.log", callgrind.wrap) as server:
        _get(server.base, 10)  # the first requests import and warm what they need
        callgrind.zero(server)
        _get(server.base, 10)
        callgrind.dump(server)  # what the warm-up left to run falls in this one
        counts = []
        for requests in (20, 20, 60):
            _get(server.base, requests)
            counts.append(callgrind.dump(server))
    # Each count is of its own interval: the same requests, about the same count (a
    # running total would double it), and three times the requests, a larger count
    # (not three times: some of what the server runs goes with time, not requests).
    assert counts[0] > 0
    assert 0.6 < counts[1] / counts[0] < 1.5
    assert counts[2] / counts[1] > 1.6
    assert not list(tmp_path.glob("cg.*"))  # each dump read and removed


@pytest.mark.parametrize(
    ("now", "wait"),
    [
        (600.0 + 5, 0.0),  # 5 s into a minute: 15 s counted end at 20 s
        (600.0 + 42.5, 0.0),  # ends at 57.5 s, the margin before the next minute kept
        (600.0 + 43, 19.0),  # would end at 58 s: wait for 2 s past the next minute
        (600.0 + 59.5, 2.5),
        (600.0 + 0.5, 1.5),  # just past a minute: only the margin
    ],
)
def test_a_counted_run_keeps_clear_of_minute_boundaries(now: float, wait: float) -> None:
    assert instructions.MINUTE_MARGIN == 2
    assert instructions.wait_before_counting(now, 15) == pytest.approx(wait)
