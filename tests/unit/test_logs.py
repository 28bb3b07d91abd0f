"""Structured logs without the app: scrubbing, the formatter, the writer thread, the
access line written by hand, the log-level setting and throttled lines."""

import io
import json
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from keysvc import logs as logs_module
from keysvc.config import ConfigError, build_settings
from keysvc.errors import DatabaseUnavailable
from keysvc.http import access
from keysvc.logs import (
    AccessLines,
    JsonFormatter,
    QueueingHandler,
    Throttled,
    configure_logging,
    scrub,
)
from keysvc.models import Key
from tests.logs import (
    KEY,
    KEYS,
    json_lines,
    root_logger_restored,  # noqa: F401 (autouse)
)


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("b'Authorization: Basic abc=\\x01'", "b'Authorization: [redacted]"),
        ("authorization:Bearer x y\nnext", "authorization: [redacted]\nnext"),
        ("sent basic QWxhZGRpbjpvcGVu then", "sent basic [redacted] then"),
        # A repr of a bad header: the whole token goes, escapes and all.
        ("Invalid: b'Basic c2VjcmV0\\x01OnNlY3JldA=='", "Invalid: b'Basic [redacted]'"),
        ("leaked keysvc_" + "a" * 42 + ".", "leaked [redacted]."),
        ("nothing to hide", "nothing to hide"),
        # Non-ASCII letters that case-insensitive matching pairs with ASCII ones.
        ("sent ba\u017fic QWxhZGRpbjpvcGVu then", "sent ba\u017fic [redacted] then"),
        ("AUTHOR\u0130ZATION: Basic abc", "AUTHOR\u0130ZATION: [redacted]"),
        ("caf\u00e9 keysvc_" + "b" * 42, "caf\u00e9 [redacted]"),
    ],
)
def test_scrub(text: str, scrubbed: str) -> None:
    assert scrub(text) == scrubbed


@pytest.mark.parametrize(
    "created",
    [0.0, 1.0, 1763757991.886, 1763757991.9995, 1763757991.9999996, 1763757991.0004999, 4.1e9],
)
def test_time_is_iso_8601_in_milliseconds(created: float) -> None:
    record = logging.LogRecord("keysvc", logging.INFO, __file__, 1, "m", (), None)
    record.created = created
    entry = json.loads(JsonFormatter().format(record))
    assert entry["time"] == datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


def test_the_writer_thread_writes_what_was_logged_when_it_was_logged() -> None:
    """Off the logging thread: a flush waits for every line; arguments and exceptions
    are taken as they were at the call; closing writes the rest and stops the thread."""
    stream = io.StringIO()
    handler = configure_logging("debug", stream, background=True)
    assert isinstance(handler, QueueingHandler)
    logger = logging.getLogger("keysvc.test")
    try:
        seen = ["first"]
        logger.info("seen %s", seen)
        seen.append("later")  # changed after the call: the line keeps what it was
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logger.exception("failed with Basic %s", "QWxhZGRpbjpvcGVu")
        logger.info("request", extra={"route": KEY, "status": 200})
        handler.flush()
        lines = json_lines(stream)
        assert [line["message"] for line in lines] == [
            "seen ['first']",
            "failed with Basic [redacted]",
            "request",
        ]
        assert "ValueError: boom\nsecond line" in lines[1]["exception"]
        assert (lines[2]["route"], lines[2]["status"]) == (KEY, 200)
        writer = handler._writer
        assert writer is not None and writer._thread.name == "keysvc-log-writer"
        assert writer._thread.is_alive()
        for n in range(100):
            logger.debug("line %d", n)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert len(json_lines(stream)) == 103  # closing wrote what was still queued
    assert not handler.running and not writer._thread.is_alive()  # and the thread ended
    logger.warning("after close")  # no handler of ours any more: nothing more is written
    assert len(json_lines(stream)) == 103


def test_formatter_keeps_a_multiline_record_on_one_line() -> None:
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        record = logging.LogRecord("keysvc", logging.ERROR, __file__, 1, "a\nb %s", ("c",), None)
        record.exc_info = sys.exc_info()
    record.__dict__["route"] = KEY
    text = JsonFormatter().format(record)
    assert "\n" not in text
    entry = json.loads(text)
    assert entry["message"] == "a\nb c"
    assert entry["level"] == "error" and entry["logger"] == "keysvc"
    assert entry["route"] == KEY
    assert "ValueError: first\nsecond" in entry["exception"]


def _key(key_id: str) -> Key:
    now = datetime.now(UTC)
    return Key(key_id, 1, "org-\u00e9", "n", "enabled", "abcd", now, None, None, [], ())


@pytest.mark.parametrize(
    "values",
    [
        (
            "6f1c2d3e-5b4a-4c9d-8e7f-0a1b2c3d4e5f",
            "GET",
            KEY,
            200,
            0.000123,
            "127.0.0.1",
            _key("k1"),
            "ok",
        ),
        (None, "POST", KEYS, 201, 0.0, None, None, None),
        ("r", "keysvc_" + "A" * 42, "unmatched", 404, 12.3456789, "::1", None, "malformed"),
        (
            "r",
            "GET",
            "/v1/verify",
            401,
            1e-7,
            "Basic abc",
            _key('q"\n\u2028'),
            "invalid_credentials",
        ),
        ("r", "PATCH", KEY, 500, 3.0, "10.0.0.1", _key("k"), None),
        # A client may put anything in the method: scrubbed.
        (
            "r",
            "keysvc_" + "A" * 42,
            KEY,
            401,
            0.123,
            None,
            _key('k\u00e9y\n"'),
            "invalid_credentials",
        ),
    ],
)
def test_the_access_line_written_by_hand_is_the_formatters(values: tuple[Any, ...]) -> None:
    """The access log's own path (no record: the formatter's head, then
    AccessEntry.fields_json, formatted by the writer) writes, byte for byte, what
    JsonFormatter writes for a record with AccessEntry.fields, time aside."""
    entry = access.AccessEntry(*values)
    stream = io.StringIO()
    logging.getLogger().handlers.clear()  # pytest's capture: then records instead
    handler = configure_logging("info", stream, background=True)
    logger = logging.getLogger("keysvc.test.access")
    try:
        AccessLines(logger, "request").emit(entry)
        handler.flush()
        assert logs_module._only_handler(logger) is not None  # the line's own path ran
    finally:
        handler.close()
    (line,) = stream.getvalue().splitlines()
    record = logging.LogRecord("keysvc.test.access", logging.INFO, __file__, 0, "request", (), None)
    record.__dict__.update(entry.fields())
    record.created = datetime.fromisoformat(json.loads(line)["time"]).timestamp()
    assert line == JsonFormatter().format(record)
    assert "AAAA" not in line and "abc" not in line  # scrubbed, as the formatter scrubs


# The thread's death is the point; pytest would report it as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_once_the_writer_is_gone_access_lines_are_written_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer thread that died (or a forked worker, which has none) takes no more
    lines: the line goes out as a record, on the caller's thread."""
    stream = io.StringIO()
    logging.getLogger().handlers.clear()
    handler = configure_logging("info", stream, background=True)
    assert isinstance(handler, QueueingHandler)
    lines = AccessLines(logging.getLogger("keysvc.test.access"), "request")
    entry = access.AccessEntry("r", "GET", KEY, 200, 0.001, "::1", None, "ok")

    def dies(self: object, items: list[object]) -> bool:
        raise SystemExit  # as an uncaught error in the thread would end it

    try:
        assert handler.running
        monkeypatch.setattr(logs_module._Writer, "_write", dies)
        handler.put_line("lost with the writer")
        writer = handler._writer
        assert writer is not None
        writer.join(5.0)
        assert not handler.running
        assert not handler.put_line("refused")
        lines.emit(entry)
        (line,) = stream.getvalue().splitlines()  # written at once, no writer needed
        assert json.loads(line)["route"] == KEY
    finally:
        handler.close()


class _Fields:
    """An access entry that says which thread wrote it out, and can fail to."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.name, self.fails, self.written_by = name, fails, ""

    def fields(self) -> dict[str, object]:
        return {"name": self.name}

    def fields_json(self) -> str:
        self.written_by = threading.current_thread().name
        if self.fails:
            raise ValueError("cannot be written")
        return f', "name": "{self.name}"}}'


def test_access_lines_are_timed_at_emit_and_written_out_by_the_writer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line carries the time of ``emit``; the writer thread formats it, and an
    entry that cannot be formatted loses its own line only, reported as logging
    reports a record it cannot format."""
    stream = io.StringIO()
    logging.getLogger().handlers.clear()
    handler = configure_logging("info", stream, background=True)
    lines = AccessLines(logging.getLogger("keysvc.test.access"), "request")
    broken, kept = _Fields("broken", fails=True), _Fields("kept")
    try:
        monkeypatch.setattr(logs_module.time, "time", lambda: 1_700_000_000.25)
        lines.emit(broken)
        lines.emit(kept)
        monkeypatch.undo()
        handler.flush()
        assert handler.running
    finally:
        handler.close()
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line) == {
        "time": "2023-11-14T22:13:20.250+00:00",
        "level": "info",
        "logger": "keysvc.test.access",
        "message": "request",
        "name": "kept",
    }
    assert broken.written_by == kept.written_by == "keysvc-log-writer"
    assert "--- Logging error ---" in capsys.readouterr().err


class FailingOnce(io.StringIO):
    """A stream whose first write fails, as a closed pipe's would."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            self.failed = True
            raise BrokenPipeError("gone")
        return super().write(text)


def test_a_failed_write_of_access_lines_alone_leaves_the_writer_running() -> None:
    stream = FailingOnce()
    handler = configure_logging("info", stream, background=True)
    assert isinstance(handler, QueueingHandler)
    try:
        assert handler.put_line('{"n": 1}')
        handler.flush()  # the write failed
        assert stream.failed and handler.put_line('{"n": 2}')
        handler.flush()
        assert stream.getvalue() == '{"n": 2}\n'  # the writer lived to write the next one
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def test_access_lines_go_through_logging_when_another_handler_listens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = io.StringIO()
    handler = configure_logging("info", stream, background=True)
    logger = logging.getLogger("keysvc.test.access")
    try:
        with caplog.at_level(logging.INFO):
            AccessLines(logger, "request").emit(
                access.AccessEntry("r", "GET", KEY, 401, 0.1, None, None, "invalid_credentials")
            )
        handler.flush()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    (record,) = [r for r in caplog.records if r.name == logger.name]
    assert record.getMessage() == "request" and record.__dict__["status"] == 401
    assert json.loads(stream.getvalue())["status"] == 401  # and the JSON line still goes out


@pytest.mark.parametrize(
    ("raw", "level"), [("debug", "debug"), ("INFO", "info"), (" Warning ", "warning")]
)
def test_log_level_setting(raw: str, level: str) -> None:
    assert build_settings(env={}).log_level == "info"
    assert build_settings(env={"KEYSVC_LOG_LEVEL": raw}).log_level == level
    assert build_settings({"log_level": raw}, env={"KEYSVC_LOG_LEVEL": "error"}).log_level == level


def test_unknown_log_level_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_LOG_LEVEL": "verbose"})
    assert str(caught.value) == (
        "log-level: 'verbose' is not a log level; use one of debug, info, warning, error, critical"
    )


def test_throttled_lines_off_the_event_loop_count_the_rest_with_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without a running loop there is no timer: the count of the lines left out
    comes with the first line of the next interval."""
    logger = logging.getLogger("keysvc.test.throttled")
    throttled = Throttled(
        logger, logging.WARNING, burst=2, interval=0.05, summary="left out %d in %g s"
    )
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for number in range(5):
            throttled.log("line %d", number)
        assert [record.getMessage() for record in caplog.records] == ["line 0", "line 1"]
        time.sleep(0.1)
        throttled.log("line %d", 5)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["line 0", "line 1", "left out 3 in 0.05 s", "line 5"]
    assert caplog.records[2].leftOut == 3


def test_log_failure_gives_the_database_one_line_and_anything_else_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("keysvc.test_log_failure")
    failures: list[Exception] = [DatabaseUnavailable("the database is locked"), RuntimeError("bug")]
    with caplog.at_level(logging.INFO, logger=logger.name):
        for failure in failures:
            try:
                raise failure
            except Exception:
                logs_module.log_failure(logger, "%s failed", "pruning")
    got = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert got == [
        (logging.WARNING, "pruning failed: the database is locked", False),
        (logging.ERROR, "pruning failed", True),
    ]
