"""The issue's premise, measured here: the baseline plus one row read, two ways.

The speed issue starts from three figures for this kind of machine: a bare
aiohttp handler returning a small JSON body serves about 5,000 to 7,000
requests/s; the same handler reading one row through aiosqlite about 2,300,
as every awaited query hops to aiosqlite's thread; a plain sqlite3 read on the
loop 4,000 to 5,000. A (bench/baseline.py) is the first. This app is the other
two, on the path of "GET a key": the key's row is read by the UUID in the path,
from keysvc's own database file, then A's view answers (404 if there is no
such row), so the only difference from A is the read.

- ``--read sqlite3``: ``sqlite3`` on the event loop's thread, one connection;
- ``--read aiosqlite``: one aiosqlite connection, and the read as one
  ``execute_fetchall``, a single hop to its thread and back (the fewest
  aiosqlite offers: ``execute`` then ``fetchone`` would take three).

Both open the file read-only. No middleware, no authentication, no cache.

    python -m bench.premise --port 8083 --shapes shapes.json --db keysvc.db --read sqlite3
"""

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
from aiohttp import web

from bench.baseline import ROUTES, Shape, View, arguments, load_shapes, replay_shape, serve

READS = ("sqlite3", "aiosqlite")
ROW = "select * from api_keys where id = ?"
CONNECTION = web.AppKey("connection", aiosqlite.Connection)


def _uri(db: Path) -> str:
    return f"{db.resolve().as_uri()}?mode=ro"


def create_app(shape: Shape, db: Path, read: str) -> web.Application:
    """An app answering ``shape`` on the GET-a-key path after reading that key's row."""
    if read not in READS:
        raise ValueError(f"read: one of {', '.join(READS)}")
    app = web.Application()
    replay = replay_shape(shape)

    async def answer(request: web.Request, row: object) -> web.Response:
        if row is None:
            return web.Response(status=404, text="no such key")
        return await replay(request)

    if read == "sqlite3":
        connection = sqlite3.connect(_uri(db), uri=True)

        async def on_loop(request: web.Request) -> web.Response:
            row = connection.execute(ROW, (request.match_info["keyId"],)).fetchone()
            return await answer(request, row)

        async def close(app: web.Application) -> None:
            connection.close()

        view: View = on_loop
        app.on_cleanup.append(close)
    else:

        async def connected(app: web.Application) -> AsyncIterator[None]:
            async with aiosqlite.connect(_uri(db), uri=True) as connection:
                app[CONNECTION] = connection
                yield

        async def hop(request: web.Request) -> web.Response:
            reader = request.app[CONNECTION]
            rows = await reader.execute_fetchall(ROW, (request.match_info["keyId"],))
            return await answer(request, next(iter(rows), None))

        view = hop
        app.cleanup_ctx.append(connected)
    app.router.add_get(ROUTES["get"][1], view)
    return app


def main() -> None:
    parser = arguments("The issue's premise: the baseline plus one row read.")
    parser.add_argument("--db", type=Path, required=True, help="keysvc's database file")
    parser.add_argument("--read", choices=READS, required=True, help="how the row is read")
    args = parser.parse_args()
    serve(create_app(load_shapes(args.shapes)["get"], args.db, args.read), args)


if __name__ == "__main__":
    main()
