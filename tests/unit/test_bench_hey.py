"""bench/hey.py: the paced client's command (the rate split over its workers, loopback
only) and its summary read into the harness's Result, failures counted."""

import pytest

from bench import hey
from bench.scenarios import Line

SUMMARY = """
Summary:
  Total:\t5.0031 secs
  Slowest:\t0.0210 secs
  Fastest:\t0.0002 secs
  Average:\t0.0006 secs
  Requests/sec:\t2998.1408

Latency distribution:
  10% in 0.0003 secs
  50% in 0.0005 secs
  90% in 0.0008 secs
  99% in 0.0013 secs

Status code distribution:
  [200]\t14990 responses
  [401]\t10 responses

Error distribution:
  [3]\tGet "http://127.0.0.1:8080/v1/verify": dial tcp: connection refused
"""


def test_the_summary_is_a_result_with_failures_counted() -> None:
    result = hey.parse(SUMMARY)
    assert (result.requests, result.non_2xx, result.socket_errors) == (15000, 10, 3)
    assert result.seconds == pytest.approx(5.0031)
    assert (result.p50_ms, result.p99_ms) == (pytest.approx(0.5), pytest.approx(1.3))
    assert result.bytes == 0  # hey counts bodies only: not comparable with wrk's


def test_a_summary_without_percentiles_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no total or percentiles"):
        hey.parse("Summary:\n  Total:\t1.0 secs\n")


def test_the_rate_is_split_over_the_workers() -> None:
    line = Line("GET", "/v1/verify", "Basic abc")
    settings = hey.PacedSettings(rate=3000, workers=16, seconds=5)
    command = hey.command("hey", "http://127.0.0.1:8080", line, settings)
    assert command[command.index("-q") + 1] == "187.500"  # 16 x 187.5 = 3000 a second
    assert command[command.index("-c") + 1] == "16"
    assert command[command.index("-z") + 1] == "5s"
    assert "Authorization: Basic abc" in command
    assert command[-1] == "http://127.0.0.1:8080/v1/verify"


def test_hey_targets_loopback_only() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        hey.command("hey", "http://10.0.0.1:8080", Line("GET", "/", ""), hey.PacedSettings(1))
