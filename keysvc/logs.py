"""Logging set-up: every record as one JSON object on one line, its ``extra=`` fields
as fields of the object.

Every text that goes out is scrubbed of Authorization values, Basic tokens and keysvc
secrets (aiohttp may log a header line it cannot parse), and aiosqlite's debug lines
lose their parameters (``WithoutParameters``), which hold keyed hashes. Records are
formatted and written off the event loop, by one writer thread draining a queue;
``AccessLines`` queues an access line's fields alone. The writer is drained at exit
(``logging.shutdown``); a process forked after set-up (``serve --workers``) has no
writer thread and writes synchronously.
"""

import asyncio
import copy
import functools
import json
import logging
import logging.handlers
import os
import queue
import re
import sys
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import IO, NamedTuple, Protocol

from keysvc.credentials import SECRET_PATTERN, SECRET_PREFIX, secret_pattern
from keysvc.errors import ServiceUnavailable

REDACTED = "[redacted]"
_SCRUBS = (
    # The rest of the line: a malformed header may hold anything after its name.
    (re.compile(r"(authorization\s*:)[^\r\n]*", re.IGNORECASE), rf"\1 {REDACTED}"),
    # To the end of the token, whatever it holds: a repr may carry escapes (\\x01) in it.
    (re.compile(r"\b(basic\s+)[^\s'\"]+", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(SECRET_PATTERN), REDACTED),
)
# Text every match of the scrubs above contains. Only for ASCII text may a lowercase
# substring test stand in for the patterns: case-insensitive matching also pairs
# non-ASCII letters with these (the long s with "s", a dotted capital I with "i").
_SECRET_MARKER = SECRET_PATTERN[: SECRET_PATTERN.index("[")]
# Secrets of a deployment's own prefix (KEYSVC_SECRET_PREFIX), scrubbed as keysvc_'s
# are: (prefix, pattern), set by ``configure_logging``.
_PREFIXED: list[tuple[str, re.Pattern[str]]] = []

# The attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
# How long the writer lets records gather before it writes them: fewer writes and
# fewer thread switches under load, and at most this much delay when idle.
GATHER_SECONDS = 0.02
# Records waiting beyond this make the logging thread wait for the writer, as a
# blocking write to a full pipe did, rather than let the backlog grow without bound.
MAX_BACKLOG = 50_000


def scrub(text: str) -> str:
    """``text`` without Authorization header values, Basic tokens or keysvc secrets."""
    if text.isascii() and _SECRET_MARKER not in text:
        lowered = text.lower()
        plain = "uthorization" not in lowered and "asic" not in lowered
        if plain and not any(prefix in text for prefix, _ in _PREFIXED):
            return text
    for pattern, replacement in _SCRUBS:
        text = pattern.sub(replacement, text)
    for _, prefixed in _PREFIXED:
        text = prefixed.sub(REDACTED, text)
    return text


def scrub_secrets_of(prefix: str) -> None:
    """Scrub the secrets of ``prefix`` too, besides the default prefix's."""
    if prefix != SECRET_PREFIX and all(known != prefix for known, _ in _PREFIXED):
        _PREFIXED.append((prefix, re.compile(secret_pattern(prefix))))


def _without_parameters(value: object) -> object:
    """A call as aiosqlite logs it (a partial of the connection's method, the SQL
    and its parameters), told by the method's name and the SQL alone."""
    if not isinstance(value, functools.partial):
        return value
    name = getattr(value.func, "__name__", "call")
    sql = next((arg for arg in value.args if isinstance(arg, str)), None)
    return f"{name}({sql!r}, parameters not logged)" if sql is not None else f"{name}(...)"


class WithoutParameters(logging.Filter):
    """Drops the parameters of the statements that aiosqlite's debug lines show."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_parameters(arg) for arg in record.args)
        return True


def _scrubbed(value: object) -> object:
    return scrub(value) if isinstance(value, str) else value


def _as_text(value: object) -> str:
    return scrub(str(value))


_ENCODER = json.JSONEncoder(default=_as_text)


class JsonFormatter(logging.Formatter):
    """time, level, logger and message, then the record's extra fields."""

    def __init__(self) -> None:
        super().__init__()
        # The time up to the second, made once a second: (whole seconds, its text).
        self._second: tuple[int, str] = (-1, "")

    def _time(self, created: float) -> str:
        """As ``datetime.isoformat(timespec="milliseconds")`` gives it, in UTC."""
        second = int(created)
        # Rounded to the microsecond first, half to even, as datetime.fromtimestamp does.
        micros = round((created - second) * 1_000_000)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        # Read once: the writer thread and, without one, the logging thread call this.
        cached = self._second
        if second != cached[0]:
            text = datetime.fromtimestamp(second, UTC).isoformat()
            cached = self._second = (second, text[: -len("+00:00")])
        return f"{cached[1]}.{micros // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = _scrubbed(value)
        # exc_text: the traceback as text, made where it was queued (QueueingHandler.prepare).
        if record.exc_text:
            entry["exception"] = scrub(record.exc_text)
        elif record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = scrub(self.formatStack(record.stack_info))
        return _ENCODER.encode(entry)


class _Flush:
    """Put on the queue by ``flush``: set once everything queued before it is written."""

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()
_TRACEBACKS = logging.Formatter()


class _Writer:
    """The thread that formats queued records and writes them, a batch at a time."""

    def __init__(
        self, records: "queue.SimpleQueue[object]", target: logging.StreamHandler[IO[str]]
    ):
        self._records = records
        self._target = target
        # Held while a batch is formatted and written, and by a fork (see _before_fork),
        # so that a child is never made halfway through a write to the stream.
        self.busy = threading.Lock()
        # Cleared by the thread as it ends: read on every line, where is_alive() cost more.
        self.alive = True
        self._thread = threading.Thread(target=self._run, name="keysvc-log-writer", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.alive = False

    def _loop(self) -> None:
        records = self._records
        while True:
            items = [records.get()]
            time.sleep(GATHER_SECONDS)
            while True:
                try:
                    items.append(records.get_nowait())
                except queue.Empty:
                    break
            with self.busy:
                stop = self._write(items)
            if stop:
                return

    def _write(self, items: list[object]) -> bool:
        """Write the records among ``items``, then release the flushes; True at _STOP."""
        target, lines, stop = self._target, [], False
        for item in items:
            if isinstance(item, str):  # formatted already
                lines.append(item + "\n")
            elif isinstance(item, _AccessLine):
                try:
                    lines.append(item.text() + "\n")
                except Exception:  # that line alone is lost, and reported as logging would
                    target.handleError(logging.makeLogRecord({"msg": "access line"}))
            elif isinstance(item, logging.LogRecord):
                try:
                    if item.levelno >= target.level and target.filter(item):
                        lines.append(target.format(item) + "\n")
                except Exception:
                    target.handleError(item)
            elif item is _STOP:
                stop = True
        if lines:
            target.acquire()
            try:
                target.stream.write("".join(lines))
                target.flush()
            except Exception:
                # Reported as logging reports a failed write, against the first record;
                # a batch of access lines alone has none, and nothing is reported.
                first = next((i for i in items if isinstance(i, logging.LogRecord)), None)
                if first is not None:
                    target.handleError(first)
            finally:
                target.release()
        for item in items:
            if isinstance(item, _Flush):
                item.done.set()
        return stop


class QueueingHandler(logging.handlers.QueueHandler):
    """Puts records on a queue for a writer thread; ``flush`` waits until they are out.

    Without a running writer (after a fork, or once closed) records go straight
    to the target handler, on the caller's thread.
    """

    def __init__(self, target: logging.StreamHandler[IO[str]]):
        records: queue.SimpleQueue[object] = queue.SimpleQueue()
        super().__init__(records)
        self._records = records
        self.target = target
        self._writer: _Writer | None = _Writer(records, target)
        _after_fork.add(self)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """Resolve now what could change or die before the writer gets to the record:
        the message's arguments and the exception. The rest is formatted later."""
        if record.args or record.exc_info or not isinstance(record.msg, str):
            record = copy.copy(record)  # other handlers see the original
            record.msg = record.getMessage()
            record.args = None
            if record.exc_info:
                record.exc_text = _TRACEBACKS.formatException(record.exc_info)
                record.exc_info = None
        return record

    def emit(self, record: logging.LogRecord) -> None:
        writer = self._writer
        if writer is None or not writer.alive:
            self.target.handle(record)
            return
        try:
            self.enqueue(self.prepare(record))
        except Exception:
            self.handleError(record)
            return
        if self._records.qsize() > MAX_BACKLOG:
            self._wait_for_writer(10.0)

    @property
    def running(self) -> bool:
        """Whether a writer thread takes queued lines (not after a fork, or once closed)."""
        writer = self._writer
        return writer is not None and writer.alive

    def put_line(self, line: "str | _AccessLine") -> bool:
        """Queue a line, as text or for the writer to format (``AccessLines``); False
        without a running writer, and then the caller logs a record instead."""
        writer = self._writer
        if writer is None or not writer.alive:
            return False
        self._records.put_nowait(line)
        if self._records.qsize() > MAX_BACKLOG:
            self._wait_for_writer(10.0)
        return True

    def _wait_for_writer(self, timeout: float) -> None:
        writer = self._writer
        if writer is None or not writer.alive:
            return
        marker = _Flush()
        self._records.put_nowait(marker)
        marker.done.wait(timeout)

    def flush(self) -> None:
        """Return once every record handled so far is written (or after 10 seconds)."""
        self._wait_for_writer(10.0)
        self.target.flush()

    def close(self) -> None:
        """Write what is queued, stop the writer; later records are written directly."""
        writer, self._writer = self._writer, None
        if writer is not None and writer.alive:
            self._records.put_nowait(_STOP)
            writer.join(10.0)
        self.target.flush()
        super().close()

    def writer_lock(self) -> "threading.Lock | None":
        writer = self._writer
        return writer.busy if writer is not None and writer.alive else None

    def forked(self) -> None:
        """In a forked child: no writer thread survived, and what was queued is the parent's."""
        self._writer = None
        self._records = self.queue = queue.SimpleQueue()


def _only_handler(logger: logging.Logger) -> tuple[QueueingHandler, JsonFormatter] | None:
    """The QueueingHandler that alone would handle ``logger``'s records, with no filter
    on the way and the JSON formatter at its end; None for any other set-up."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        handlers += current.handlers
        current = current.parent if current.propagate else None
    if len(handlers) != 1 or not isinstance(handlers[0], QueueingHandler):
        return None
    handler = handlers[0]
    target, formatter = handler.target, handler.target.formatter
    if handler.filters or target.filters or type(formatter) is not JsonFormatter:
        return None
    return handler, formatter


class AccessFields(Protocol):
    """What ``AccessLines.emit`` writes: the line's fields, and the same fields as
    JSON text, each written as ``JsonFormatter`` would write that record's extras."""

    def fields(self) -> dict[str, object]:
        """The fields, as a record's ``extra``."""
        ...

    def fields_json(self) -> str:
        """``, "name": value`` for each field, top-level strings scrubbed, then ``}``."""
        ...


class _AccessLine(NamedTuple):
    """An access line as queued, made into text by the writer thread. Formatting a
    batch of lines there, one after another, costs a fraction of formatting each on
    the loop between requests (docs/PERFORMANCE.md); ``entry`` must not change once queued."""

    created: float
    formatter: JsonFormatter
    constant: str
    entry: AccessFields

    def text(self) -> str:
        time_text = self.formatter._time(self.created)
        return f'{{"time": "{time_text}"{self.constant}{self.entry.fields_json()}'


class AccessLines:
    """One INFO line per call, for a logger that logs nothing else: the access log.

    Where ``logger``'s records would reach only a running ``QueueingHandler``
    writing JSON lines, no ``LogRecord`` is made and no handler chain walked: the
    caller's thread queues the time and the entry, and the writer thread puts the
    line together, exactly as ``JsonFormatter`` would format the record
    (``tests/unit/test_logs.py`` compares them): the formatter's time, level, logger
    and message, then the fields' own JSON text (docs/PERFORMANCE.md says what
    the access log still costs). Any other set-up (another handler, a filter,
    pytest's log capture, a forked worker without a writer) gets records through
    ``logging``, as before. The set-up is looked at on the first line, so
    configure logging before serving.
    """

    _UNSEEN = object()

    def __init__(self, logger: logging.Logger, message: str):
        self._logger = logger
        self._message = message
        self._handler: object = self._UNSEEN  # then what _only_handler said
        # level, logger and message, as JsonFormatter writes them after the time
        self._constant = (
            f', "level": "info", "logger": {_ENCODER.encode(logger.name)},'
            f' "message": {_ENCODER.encode(scrub(message))}'
        )

    def _fast(self) -> tuple["QueueingHandler", "JsonFormatter"] | None:
        handler = self._handler
        if handler is self._UNSEEN:
            handler = self._handler = _only_handler(self._logger)
        if (
            isinstance(handler, tuple)
            and handler[0].running
            and handler[0].level <= logging.INFO
            and handler[0].target.level <= logging.INFO
        ):
            return handler
        return None

    def emit(self, entry: AccessFields) -> None:
        logger = self._logger
        if not logger.isEnabledFor(logging.INFO):
            return
        handler = self._fast()
        if handler is not None:
            queueing, formatter = handler
            if queueing.put_line(_AccessLine(time.time(), formatter, self._constant, entry)):
                return
        # As logger.info would, less the walk up the stack for a caller nobody logs.
        fields = entry.fields()
        record = logger.makeRecord(
            logger.name, logging.INFO, __file__, 0, self._message, (), None, extra=fields
        )
        logger.handle(record)


def log_failure(logger: logging.Logger, message: str, *args: object) -> None:
    """In an ``except`` block, of a write keysvc makes on its own (upkeep, a revoked
    key's use, webhook deliveries): the database being unavailable (locked by another
    process, stopped, gone: ``keysvc.errors.ServiceUnavailable``) is one warning line
    with its reason and no traceback, as it is the database's state and not a fault of
    keysvc's (rt53 R2); any other error is logged with its traceback."""
    error = sys.exc_info()[1]
    if isinstance(error, ServiceUnavailable):
        logger.warning(message + ": %s", *args, error.message)
    else:
        logger.exception(message, *args)


class Throttled:
    """Log lines of one kind that a client can cause at will, at most ``burst`` per
    ``interval`` seconds: the rest are counted, and when the interval ends one line
    (``summary``, formatted with that count and the interval) says how many were left
    out. A flood of bad requests or refused connections thus costs a few lines, not
    one each. Called on the event loop, the summary comes on time from a loop timer;
    elsewhere it comes with the next line of the kind.
    """

    def __init__(
        self, logger: logging.Logger, level: int, *, burst: int, interval: float, summary: str
    ):
        self._logger = logger
        self._level = level
        self._burst = burst
        self._interval = interval
        self._summary = summary
        self._window_ends = 0.0
        self._written = 0
        self._left_out = 0
        self._timer: asyncio.TimerHandle | None = None

    def log(self, message: str, *args: object, extra: dict[str, object] | None = None) -> None:
        now = time.monotonic()
        if now >= self._window_ends:
            self._summarize()
            self._window_ends, self._written = now + self._interval, 0
        if self._written < self._burst:
            self._written += 1
            self._logger.log(self._level, message, *args, extra=extra)
            return
        self._left_out += 1
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._timer = loop.call_later(self._window_ends - now, self._summarize)

    def _summarize(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        left_out, self._left_out = self._left_out, 0
        if left_out:
            self._logger.log(
                self._level, self._summary, left_out, self._interval, extra={"leftOut": left_out}
            )


_after_fork: "weakref.WeakSet[QueueingHandler]" = weakref.WeakSet()


_held: list[threading.Lock] = []


def _before_fork() -> None:
    for handler in list(_after_fork):
        busy = handler.writer_lock()
        if busy is not None:
            busy.acquire()
            _held.append(busy)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_child() -> None:
    _held.clear()  # the child's copies are never used again
    for handler in list(_after_fork):
        handler.forked()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


def configure_logging(
    level: str,
    stream: IO[str] | None = None,
    *,
    background: bool | None = None,
    secret_prefix: str = SECRET_PREFIX,
) -> logging.Handler:
    """Send every logger's records at ``level`` and above to ``stream`` (stderr) as JSON lines,
    scrubbed of secrets, those of the deployment's ``secret_prefix`` included.

    ``background`` (the default without ``stream``): format and write on a writer
    thread, see ``QueueingHandler``; otherwise on the thread that logs.
    """
    scrub_secrets_of(secret_prefix)
    target = logging.StreamHandler(stream or sys.stderr)
    target.setFormatter(JsonFormatter())
    handler: logging.Handler = target
    if background if background is not None else stream is None:
        handler = QueueingHandler(target)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    statements = logging.getLogger("aiosqlite")
    if not any(isinstance(known, WithoutParameters) for known in statements.filters):
        statements.addFilter(WithoutParameters())
    return handler
