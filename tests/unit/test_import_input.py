"""``keysvc import`` reads its input in blocks from its descriptor
(``keysvc.cli.porting._Input``), not through the stream's buffered ``readline``, so
that the thread reading it can stop: its lines must be the ones ``readline`` gives,
for every limit, from a file, a pipe and a stream without a descriptor."""

import gc
import io
import os
import random
import threading
import weakref
from pathlib import Path

import pytest

from keysvc.cli import porting
from keysvc.cli.importworker import YOUNG, collected_per_batch


def _data(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randrange(0, 60)):
        parts.append(rng.randbytes(rng.choice([0, 1, 5, 40, 300, 5000])))
        parts.append(rng.choice([b"\n", b"\r\n", b"\n\n", b""]))
    return b"".join(parts)


def _lines(read: "porting._Input | io.BufferedIOBase", limit: int) -> list[bytes]:
    lines = []
    while line := read.readline(limit):
        lines.append(line)
    return lines


@pytest.mark.parametrize("seed", range(40))
def test_its_lines_are_readlines_lines(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    data = _data(rng)
    limit = rng.choice([1, 2, 7, 100, 4096, 1024 * 1024 + 1])
    expected = _lines(io.BytesIO(data), limit)
    stopped = threading.Event()
    assert _lines(porting._Input(io.BytesIO(data), stopped), limit) == expected
    path = tmp_path / "keys.jsonl"
    path.write_bytes(data)
    with path.open("rb") as stream:
        assert _lines(porting._Input(stream, stopped), limit) == expected
    read_end, write_end = os.pipe()
    writer = threading.Thread(target=_write_all, args=(write_end, data, rng.randrange(1, 9000)))
    writer.start()
    with os.fdopen(read_end, "rb") as stream:
        assert _lines(porting._Input(stream, stopped), limit) == expected
    writer.join()


def _write_all(fd: int, data: bytes, step: int) -> None:
    with os.fdopen(fd, "wb", buffering=0) as out:
        for start in range(0, len(data), step):
            out.write(data[start : start + step])


def test_a_reader_waiting_for_its_input_stops_when_told() -> None:
    read_end, write_end = os.pipe()
    stopped = threading.Event()
    failed: list[BaseException] = []

    def read() -> None:
        with os.fdopen(read_end, "rb") as stream:
            try:
                porting._Input(stream, stopped).readline(100)
            except BaseException as exc:
                failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    os.write(write_end, b"half a line")
    stopped.set()
    reader.join(timeout=5)
    os.close(write_end)
    assert not reader.is_alive()
    assert [type(exc) for exc in failed] == [porting._Stopped]


class _Node:
    next: object = None


def test_the_collector_runs_once_a_batch_and_is_put_back_as_it_was() -> None:
    assert gc.isenabled()
    thresholds = gc.get_threshold()
    with collected_per_batch() as collect:
        assert gc.get_freeze_count() > 0  # what was alive before, left out of collections
        cycle = _Node()
        cycle.next = cycle
        gone = weakref.ref(cycle)
        del cycle
        collect()
        assert gone() is None
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds
    gc.disable()
    try:
        with collected_per_batch():
            pass
        assert not gc.isenabled()  # as it was
    finally:
        gc.enable()


def test_garbage_made_within_a_batch_is_collected_as_it_goes() -> None:
    # A refused record leaves cycles (marshmallow's errors: hundreds of objects a line);
    # a batch of 10,000 such lines kept until its end held 1.4 to 3.2 GB (rt62 F1). The
    # young are collected as they pile up, without waiting for the batch's end.
    with collected_per_batch():
        first = _Node()
        first.next = first
        gone = weakref.ref(first)
        del first
        for _ in range(YOUNG * 3):
            cycle = _Node()
            cycle.next = cycle
        assert gone() is None
