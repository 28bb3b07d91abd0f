"""``keysvc import`` and ``keysvc export`` (issue 37): keys in and out of an
organization as JSON Lines, one record a line, streamed both ways.

The import reads its file a line at a time and stores it in batches (each one
transaction, ``keysvc.domain.imports.write_batch``, as the API's request is), each
line checked as the API checks a body and its record (``keysvc.http.import_schemas``);
a refused line is reported on standard error by its line number, and the rest go in.
A file of more than one batch is checked and planned in a second process
(``keysvc.cli.importworker``) while this one writes. The summary is one
JSON object on standard output; the exit code is 0 when every line was imported or
skipped as imported before, 1 when some were refused.

The export writes the organization's keys in their order, a page at a time (keyset
paging, ``Store.list_keys``), so that its memory does not grow with the organization:
public fields only, each line an import record (``keysvc.domain.imports.exported``).
"""

import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import pickle
import select
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import IO, Any

from keysvc.cli.importworker import Failed, Line, Refused, collected_per_batch, plan_lines
from keysvc.cli.importworker import run as worker_main
from keysvc.config import ConfigError, Settings
from keysvc.db.backends import open_store
from keysvc.domain import imports
from keysvc.http.render import STORE_RECORDS

# Keys an export reads at a time.
EXPORT_PAGE = 1000
# The longest line read: a record is a few KiB (the API takes a thousand in 8 MiB), and
# a longer line is refused by its number without being kept, so that one line of a
# gigabyte costs no gigabyte.
MAX_LINE_BYTES = 1024 * 1024

# Records a transaction of the CLI's import, at most (``--batch``), and by default on
# SQLite. Larger than the API's 1,000: a batch's random index writes (the two hashes'
# indexes) touch fewer pages a key the more keys share a transaction, and each commit
# writes its pages to the WAL once (100,000 keys into a new file: 74 s in batches of
# 1,000, 44 s in 5,000; 1,000,000 keys: 48 s in 10,000, 43 s in 20,000). But a batch
# holds SQLite's write lock while it is written: on a file of 1.8 million keys that a
# server served, batches of 20,000 held another tenant's disable up to 5 s, its busy
# timeout, and one got a 503 (rt60 F1); 10,000 held it 1.3 to 3.3 s at most in four
# runs. 20,000 is for a file no server serves while it is imported.
MAX_BATCH = 20_000
SQLITE_BATCH = 10_000
# The raw lines a batch holds until they are checked, at most: far above a batch of
# real records (10,000 of them are about 3 MB).
BATCH_BYTES = 16 * 1024 * 1024
# On PostgreSQL, by default: a batch holds keysvc's write lock, which every instance's
# writes take (another tenant's disable included), for as long as it is written; 10,000
# keys held it about 5 s on a loaded 2-core machine, the API's 1,000 under one.
POSTGRES_BATCH = 1_000
# Batches planned by the worker that wait to be written, at most: while one is
# written, the worker plans on (each batch's rows are some MiB).
PLANNED_AHEAD = 2
# How long a stopped import waits for its sender thread to end: it looks whether the
# import stopped every STOP_POLL seconds while it waits for its input.
SENDER_WAIT_SECONDS = 1.0
STOP_POLL = 0.1
# How long a stopped import waits for its planning process to end on SIGTERM before it
# kills it (one that was itself stopped, SIGSTOP, would never end).
WORKER_WAIT_SECONDS = 2.0
# What the import reads of its file at a time.
READ_BYTES = 1024 * 1024


class _Stopped(Exception):
    """The import stopped while its input was being read (``_Input``)."""


class _Input:
    """A file's lines, read in blocks from its descriptor when it has one: a thread
    waiting for more of a pipe (standard input) looks at ``stopped`` every STOP_POLL
    seconds, so the import can end without it. Never through the stream's own buffer,
    whose lock a waiting read would hold, and whose close (the command's, Python's at
    exit) would then wait for it."""

    def __init__(self, stream: IO[bytes], stopped: threading.Event) -> None:
        self._stream = stream
        self._stopped = stopped
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
            self._fd = None
        self._data = b""
        self._at = 0
        self._ended = False

    def readline(self, limit: int) -> bytes:
        """The next line, with its newline, or its first ``limit`` bytes; b"" at the end."""
        while True:
            end = self._data.find(b"\n", self._at, self._at + limit)
            if end >= 0:
                line = self._data[self._at : end + 1]
            elif len(self._data) - self._at >= limit or self._ended:
                line = self._data[self._at : self._at + limit]
            else:
                block = self._block()
                self._ended = not block
                self._data, self._at = self._data[self._at :] + block, 0
                continue
            self._at += len(line)
            return line

    def _block(self) -> bytes:
        if self._fd is None:
            return self._stream.read(READ_BYTES)
        while not select.select([self._fd], [], [], STOP_POLL)[0]:
            if self._stopped.is_set():
                raise _Stopped
        return os.read(self._fd, READ_BYTES)


def _lines(stream: _Input) -> Iterator[Line]:
    """Each non-blank line's number and bytes; instead of the bytes, why it is refused
    for one longer than MAX_LINE_BYTES, which is not kept. Read as bytes, so that one
    bad line is that line's refusal, not the end of the import (the JSON and UTF-8
    checks are the planning's: ``keysvc.cli.importworker.decoded``)."""
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
            yield number, f"longer than {MAX_LINE_BYTES} bytes"
            continue
        if line.strip():
            yield number, line


def _batches(stream: _Input, batch: int) -> Iterator[list[Line]]:
    """The file's lines, ``batch`` at a time, or fewer where they reach BATCH_BYTES:
    lines are kept as read until they are checked, and a file of lines of a MiB
    (refused, each) must not cost a batch's count of them (rt60 F2)."""
    lines: list[Line] = []
    size = 0
    for line in _lines(stream):
        lines.append(line)
        size += len(line[1])
        if len(lines) >= batch or size >= BATCH_BYTES:
            yield lines
            lines, size = [], 0
    if lines:
        yield lines


def import_file(
    settings: Settings, organization_id: str, stream: IO[bytes], batch: int, errors: IO[str]
) -> tuple[dict[str, Any], int]:
    """Import the records of ``stream`` into ``organization_id``; the summary and the
    exit code."""
    return asyncio.run(_import(settings, organization_id, stream, batch, errors))


# Writes a planned batch: the lines refused, the batch.
Write = Callable[[list[Refused], imports.PlannedBatch], Awaitable[None]]


async def _import(
    settings: Settings, organization_id: str, stream: IO[bytes], batch: int, errors: IO[str]
) -> tuple[dict[str, Any], int]:
    started = time.perf_counter()
    totals = {"imported": 0, "skipped": 0, "refused": 0}
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        if organization_id not in await store.organization_ids():
            raise ConfigError(f"import: no organization {organization_id} in this database")
        turns = imports.ImportTurns()

        async def write(refused: list[Refused], planned: imports.PlannedBatch) -> None:
            result = await imports.write_batch(
                store, planned, settings.max_keys_per_org, imports.CLI_ACTOR, turns
            )
            for line, _, reason in sorted([*refused, *result.errors]):
                print(f"keysvc: import: line {line}: {reason}", file=errors)
            totals["imported"] += len(result.imported)
            totals["skipped"] += len(result.skipped)
            totals["refused"] += len(refused) + len(result.errors)

        # A file of one batch is planned and written here; a longer one is planned in a
        # second process while this one writes (``keysvc.cli.importworker``).
        # The first two batches are read on a thread too: a Ctrl-C cancels the loop's
        # task at an await, never inside a read that waits for input (rt61 F1).
        stopped = threading.Event()
        batches = _batches(_Input(stream, stopped), batch)
        loop = asyncio.get_running_loop()
        try:
            first = await loop.run_in_executor(None, next, batches, None)
            second = (
                None if first is None else await loop.run_in_executor(None, next, batches, None)
            )
        except BaseException:
            stopped.set()  # the thread's read then ends within STOP_POLL
            raise
        if first is not None and second is None:
            await write(*await plan_lines(store, hasher, organization_id, first))
        elif first is not None and second is not None:
            both = itertools.chain((first, second), batches)
            await _planned_apart(settings, organization_id, both, write, stopped)
    seconds = time.perf_counter() - started
    summary = {**totals, "seconds": round(seconds, 3)}
    keys = totals["imported"] + totals["skipped"]
    summary["keysPerSecond"] = round(keys / seconds) if seconds > 0 else 0
    return summary, 1 if totals["refused"] else 0


async def _planned_apart(
    settings: Settings,
    organization_id: str,
    batches: Iterator[list[Line]],
    write: Write,
    stopped: threading.Event,
) -> None:
    """Each batch of ``batches`` planned by the worker process and written here, in
    order. Two threads keep the worker busy while a batch is written: one reads the
    lines and sends them (a full pipe blocks that thread, not the loop), one takes its
    answers as they come, up to PLANNED_AHEAD of them waiting to be written.
    ``stopped`` is set when it ends: the reading thread then stops too (``_Input``)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    worker = context.Process(
        target=worker_main, args=(theirs,), name="keysvc-import-plan", daemon=True
    )
    worker.start()
    theirs.close()
    loop = asyncio.get_running_loop()
    answers: asyncio.Queue[Any] = asyncio.Queue(PLANNED_AHEAD)
    unread: list[BaseException] = []  # the file's read error, if any, for this thread
    sender = threading.Thread(
        target=_send, args=(ours, settings, organization_id, batches, unread), daemon=True
    )
    taker = threading.Thread(target=_take, args=(ours, worker, loop, answers), daemon=True)
    sender.start()
    taker.start()
    try:
        with collected_per_batch() as collect:
            while (answer := await answers.get()) is not None:
                if isinstance(answer, BaseException):
                    raise answer
                await write(*answer)
                del answer  # collected with the rest of its batch
                collect()
        if unread:
            raise unread[0]
    finally:
        stopped.set()
        if worker.is_alive():
            worker.terminate()  # the threads' next send or receive then fails: they end
            worker.join(WORKER_WAIT_SECONDS)
            if worker.is_alive():  # stopped (SIGSTOP), SIGTERM waits: rt60 F4
                worker.kill()
        worker.join()
        while not answers.empty():  # room for the taker's last answer, if it waits
            answers.get_nowait()
        await loop.run_in_executor(None, taker.join)
        await loop.run_in_executor(None, sender.join, SENDER_WAIT_SECONDS)
        ours.close()


def _take(
    conn: Connection,
    worker: BaseProcess,
    loop: asyncio.AbstractEventLoop,
    answers: "asyncio.Queue[Any]",
) -> None:
    """The worker's answers onto ``answers``, in order, then None (or the reason it
    stopped): a full queue blocks this thread until the loop takes one."""
    while True:
        try:
            answer = _receive(conn, worker)
        except ImportStopped as stopped:
            answer = stopped
        if isinstance(answer, Failed):
            answer = ImportStopped(f"import: the planning process stopped: {answer.reason}")
        put = answers.put(answer)
        try:
            asyncio.run_coroutine_threadsafe(put, loop).result()
        except RuntimeError:  # the loop is closed: the import has ended
            put.close()
            return
        if answer is None or isinstance(answer, BaseException):
            return


def _send(
    conn: Connection,
    settings: Settings,
    organization_id: str,
    batches: Iterator[list[Line]],
    unread: list[BaseException],
) -> None:
    """The worker's messages: the settings and organization, each batch, then None."""
    try:
        conn.send_bytes(pickle.dumps((settings, organization_id)))
        for lines in batches:
            conn.send_bytes(pickle.dumps(lines, pickle.HIGHEST_PROTOCOL))
    except _Stopped:
        return
    except OSError as exc:  # the file, or the pipe of a worker that stopped
        if not isinstance(exc, BrokenPipeError):
            unread.append(exc)
    with contextlib.suppress(OSError):
        conn.send_bytes(pickle.dumps(None))


def _receive(conn: Connection, worker: BaseProcess) -> Any:
    """The worker's next answer; None once it has answered every batch."""
    try:
        return pickle.loads(conn.recv_bytes())  # noqa: S301 - our own worker's answer
    except (EOFError, OSError):
        worker.join()
        if worker.exitcode == 0:
            return None
        raise ImportStopped(
            f"import: the planning process ended with exit code {worker.exitcode}"
        ) from None


class ImportStopped(ConfigError):
    """The import stopped before its end: the batches written so far stay written."""


def export(settings: Settings, organization_id: str, out: IO[str]) -> int:
    """Write the organization's keys to ``out``; how many."""
    return asyncio.run(_export(settings, organization_id, out))


async def _export(settings: Settings, organization_id: str, out: IO[str]) -> int:
    written = 0
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, _):
        if organization_id not in await store.organization_ids():
            raise ConfigError(f"export: no organization {organization_id} in this database")
        after = 0
        while True:
            page = await store.list_keys(organization_id, after, EXPORT_PAGE)
            out.writelines(
                json.dumps(imports.exported(key), separators=(",", ":")) + "\n" for key in page.keys
            )
            written += len(page.keys)
            if not page.more or not page.keys:
                break
            after = page.keys[-1].org_seq
    out.flush()
    return written


def open_input(path: str) -> IO[bytes]:
    """The file to import, or standard input for ``-``, as bytes (``_lines``)."""
    if path == "-":
        if sys.stdin is None:  # its descriptor closed: Python has none (rt61 F4)
            raise ConfigError("import: - names standard input, and this command has none")
        return sys.stdin.buffer
    return open(path, "rb")
