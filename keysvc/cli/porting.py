"""``keysvc import`` and ``keysvc export`` (issue 37): keys in and out of an
organization as JSON Lines, one record a line, streamed both ways.

The import reads its file a line at a time and stores it in batches (each one
transaction, ``keysvc.domain.imports.import_batch``, as the API's request is), each
record checked as the API checks it (``keysvc.http.import_schemas``); a refused line is
reported on standard error by its line number, and the rest go in. The summary is one
JSON object on standard output; the exit code is 0 when every line was imported or
skipped as imported before, 1 when some were refused.

The export writes the organization's keys in their order, a page at a time (keyset
paging, ``Store.list_keys``), so that its memory does not grow with the organization:
public fields only, each line an import record (``keysvc.domain.imports.exported``).
"""

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

from keysvc.config import ConfigError, Settings
from keysvc.db.backends import open_store
from keysvc.domain import imports
from keysvc.http.import_schemas import load_records
from keysvc.http.render import STORE_RECORDS
from keysvc.timeutil import utcnow

# Keys an export reads at a time.
EXPORT_PAGE = 1000
# The longest line read: a record is a few KiB (the API takes a thousand in 8 MiB), and
# a longer line is refused by its number without being kept, so that one line of a
# gigabyte costs no gigabyte.
MAX_LINE_BYTES = 1024 * 1024

# Records a transaction of the CLI's import, at most and by default (``--batch``).
# Larger than the API's 1,000: a batch's random index writes (the two hashes' indexes)
# touch fewer pages a key the more keys share a transaction, and each commit writes
# its pages to the WAL once (100,000 keys into a new file: 74 s in batches of 1,000,
# 44 s in 5,000).
MAX_BATCH = 10_000
# On PostgreSQL, by default: a batch holds keysvc's write lock, which every instance's
# writes take (another tenant's disable included), for as long as it is written; 10,000
# keys held it about 5 s on a loaded 2-core machine, the API's 1,000 under one.
POSTGRES_BATCH = 1_000
# Lines the import reads, then checks in one call, between two turns of the batch
# being written.
YIELD_EVERY = 20
# A refused line: its number, its importId if it has one, why.
Refused = tuple[int, str | None, str]


def _lines(stream: IO[bytes], first: int) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's number and JSON value: a ``ValueError`` instead for one
    that is longer than MAX_LINE_BYTES, not UTF-8, or not JSON. Read as bytes, so that
    one bad line is that line's refusal, not the end of the import."""
    number = first - 1
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
            yield number, ValueError(f"longer than {MAX_LINE_BYTES} bytes")
            continue
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, ValueError(f"not UTF-8: {exc}")
            continue
        try:
            yield number, json.loads(text)
        except ValueError as exc:
            yield number, ValueError(f"not JSON: {exc}")


def import_file(
    settings: Settings, organization_id: str, stream: IO[bytes], batch: int, errors: IO[str]
) -> tuple[dict[str, Any], int]:
    """Import the records of ``stream`` into ``organization_id``; the summary and the
    exit code."""
    return asyncio.run(_import(settings, organization_id, stream, batch, errors))


async def _import(
    settings: Settings, organization_id: str, stream: IO[bytes], batch: int, errors: IO[str]
) -> tuple[dict[str, Any], int]:
    started = time.perf_counter()
    totals = {"imported": 0, "skipped": 0, "refused": 0}
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        if organization_id not in await store.organization_ids():
            raise ConfigError(f"import: no organization {organization_id} in this database")
        running: asyncio.Task[None] | None = None
        turns = imports.ImportTurns()

        async def store_batch(
            now: datetime, valid: list[tuple[int, dict[str, Any]]], refused: list[Refused]
        ) -> None:
            result = await imports.import_batch(
                store,
                hasher,
                None,
                organization_id,
                valid,
                now,
                settings.max_keys_per_org,
                imports.CLI_ACTOR,
                turns,
            )
            for line, _, reason in sorted([*refused, *result.errors]):
                print(f"keysvc: import: line {line}: {reason}", file=errors)
            totals["imported"] += len(result.imported)
            totals["skipped"] += len(result.skipped)
            totals["refused"] += len(refused) + len(result.errors)

        # While one batch is written (SQLite's work runs on its connection's thread), the
        # next is read, and checked YIELD_EVERY lines at a time: the file is read ahead by
        # one batch at most. After each of those the batch being written is let go on to
        # its next statement, so that the two run side by side.
        now, lines = utcnow(), 0
        valid: list[tuple[int, dict[str, Any]]] = []
        refused: list[Refused] = []
        read: list[tuple[int, Any]] = []  # lines read, checked YIELD_EVERY at a time
        for number, value in _lines(stream, 1):
            read.append((number, value))
            lines += 1
            if lines % YIELD_EVERY and lines < batch:
                continue
            _check(read, now, valid, refused)
            read = []
            await asyncio.sleep(0)
            if lines >= batch:
                if running is not None:
                    await running
                running = asyncio.create_task(store_batch(now, valid, refused))
                now, lines, valid, refused = utcnow(), 0, [], []
                await asyncio.sleep(0)  # let it start
        if running is not None:
            await running
        _check(read, now, valid, refused)
        if lines:
            await store_batch(now, valid, refused)
    seconds = time.perf_counter() - started
    summary = {**totals, "seconds": round(seconds, 3)}
    keys = totals["imported"] + totals["skipped"]
    summary["keysPerSecond"] = round(keys / seconds) if seconds > 0 else 0
    return summary, 1 if totals["refused"] else 0


def _check(
    read: list[tuple[int, Any]],
    now: datetime,
    valid: list[tuple[int, dict[str, Any]]],
    refused: list[Refused],
) -> None:
    """The lines ``read`` checked (``load_records``), added to ``valid`` and ``refused``."""
    good, bad = load_records(read, now)
    valid += good
    refused += bad


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
        return sys.stdin.buffer
    return open(path, "rb")
