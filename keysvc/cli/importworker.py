"""``keysvc import``'s second process (issue 37): it checks and plans each batch of
lines (``keysvc.domain.imports.plan_batch``: the records' checks, their material's
hashes, their keys' UUIDs, rows and activity views) while the command's own process
writes the batch before it. Python runs one thread at a time in a process, so the
checks and the writes could not run side by side in one; in two, each has a core.

The protocol, over one ``multiprocessing`` pipe, each message pickled:
- the command sends its settings and organization first, then each batch of lines as
  (line number, the line's bytes or the reason it could not be read), then None;
- the worker answers each batch, in order, with the lines it refused (number, importId,
  reason) and the batch planned (``PlannedBatch``), or with ``Failed`` and why, then
  ends. It imports nothing: its store is opened, as every command opens it, for the
  roles the records name.

The pipe is an anonymous pair of sockets between the command and the process it
started (``multiprocessing``'s spawn), which no other process can reach: pickle is
read from it only because both ends are keysvc's own.
"""

import asyncio
import contextlib
import gc
import itertools
import pickle
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from keysvc.config import Settings
from keysvc.credentials import Hasher
from keysvc.db.backends import open_store
from keysvc.db.contract import Store
from keysvc.domain import imports
from keysvc.errors import BadRequest
from keysvc.http.import_schemas import load_records
from keysvc.http.render import STORE_RECORDS
from keysvc.http.views.common import decode_json
from keysvc.timeutil import utcnow

# A line as the command read it: its number, and its bytes or why it was refused.
Line = tuple[int, bytes | str]
# A refused line: its number, its importId if it has one, why.
Refused = tuple[int, str | None, str]


@dataclass(frozen=True)
class Failed:
    """The worker stopped: why (the command reports it and stops too)."""

    reason: str


# The collector while an import runs (``collected_per_batch``): the young generation
# collected every YOUNG allocations (Python's default is 700), the older ones only
# between batches, everything every FULL_EVERY batches.
YOUNG = 20_000
FULL_EVERY = 16
_NEVER = 1 << 30  # a threshold of the older generations: never reached by counting


@contextlib.contextmanager
def collected_per_batch() -> Iterator[Callable[[], None]]:
    """Python's cycle collector, while the import's batches are planned or written: the
    young collected as they pile up, the older generations between batches (by calling
    what this yields), not every few hundred allocations. Both of the import's
    processes hold batches of some hundred thousand objects that live until written,
    and by Python's thresholds the collector went through them again and again,
    finding nothing: per 200,000 keys, 5.2 s of the planning process's CPU and 1.7 s
    of the command's (the latter holding the GIL SQLite's thread needs), on a slow
    afternoon's machine. A young collection sees only what was made since the last,
    so each object once; a refused record's cycles (marshmallow's errors, hundreds of
    objects a line) are freed within YOUNG allocations, not at the batch's end (rt62
    F1: 1.4 to 3.2 GB for a batch of such lines, with the collector off until then).
    What is alive at the start (modules, the store) is frozen out of the collections
    (``gc.freeze``). The collector's state is as it was after."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG, _NEVER, _NEVER)
    gc.enable()
    batches = itertools.count(1)

    def collect() -> None:
        gc.collect(1 if next(batches) % FULL_EVERY else 2)

    try:
        yield collect
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()


def decoded(lines: Sequence[Line]) -> list[tuple[int, Any]]:
    """Each line's JSON value, checked as the API checks a body (``decode_json``: no
    repeated field, no NaN, bounded numbers and nesting, no lone surrogate escape), or
    a ``ValueError`` saying why it has none."""
    out: list[tuple[int, Any]] = []
    for number, line in lines:
        if isinstance(line, str):
            out.append((number, ValueError(line)))
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append((number, ValueError(f"not UTF-8: {exc}")))
            continue
        try:
            out.append((number, decode_json(line, object, "JSON")))
        except BadRequest as exc:
            # The body's own faults ("body: invalid JSON at ...") as the line's; a
            # field's ("name: holds a lone surrogate escape") as they are.
            whole = exc.message.startswith("body: ")
            reason = f"not JSON: {exc.message.removeprefix('body: ')}" if whole else exc.message
            out.append((number, ValueError(reason)))
    return out


async def plan_lines(
    store: Store, hasher: Hasher, organization_id: str, lines: Sequence[Line]
) -> tuple[list[Refused], imports.PlannedBatch]:
    """A batch of lines checked and planned: those refused, and the rest planned."""
    now = utcnow()
    valid, refused = load_records(decoded(lines), now)
    planned = await imports.plan_batch(store, hasher, None, organization_id, valid, now)
    return refused, planned


def run(conn: Connection) -> None:
    """The worker process's body (``multiprocessing`` target). Ctrl-C reaches the
    whole process group: the command stops this process itself, so it ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        settings, organization_id = pickle.loads(conn.recv_bytes())  # noqa: S301 - see above
        asyncio.run(_serve(conn, settings, organization_id))
    except (EOFError, BrokenPipeError):
        pass  # the command went away: nothing to answer
    except Exception as exc:  # said to the command, which stops
        with contextlib.suppress(OSError):
            conn.send_bytes(pickle.dumps(Failed(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


async def _serve(conn: Connection, settings: Settings, organization_id: str) -> None:
    loop = asyncio.get_running_loop()
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        with collected_per_batch() as collect:
            while True:
                message = await loop.run_in_executor(None, conn.recv_bytes)
                lines = pickle.loads(message)  # noqa: S301 - see above
                if lines is None:
                    return
                answer = pickle.dumps(
                    await plan_lines(store, hasher, organization_id, lines),
                    pickle.HIGHEST_PROTOCOL,
                )
                del message, lines  # collected with the batch's own objects
                await loop.run_in_executor(None, conn.send_bytes, answer)
                collect()
