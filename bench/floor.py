"""The floor (F): the baseline plus only the work the issues ask of every request.

Where A (bench/baseline.py) replays keysvc's answers with nothing else, F does,
on every request, the least that any implementation of keysvc must:

- a fresh UUIDv4 request ID, in ``X-Request-Id`` and in the body where keysvc
  puts one (keysvc's own generator, ``keysvc.middleware.new_request_id``);
- the secret checked: the Authorization header's keyed hash (keysvc's
  ``Hasher.of_header``) looked up among headers already proven, and the secret
  hash remembered with it compared in constant time, as keysvc does for a
  header it has seen; the failed-login window of the client address looked up;
- one access line naming the caller, queued and written by a thread, a batch
  at a time;
- the request counted by route, method and status.

aiohttp's router and one middleware run, as in keysvc. Everything else keysvc
does (its schemas, its cache and store and their freshness checks, the rate and
usedAt checks, the permission check, the path's checks) is not here, and a
header seen for the first time is taken as proven without a check. So F/A is an
upper bound on B/A for the issue's requirements with aiohttp on this machine,
and B/F (B/A over F/A, from the same table) is what the rest of keysvc costs.
F answers every request as keysvc answered the first: it writes nothing, so for
create it is no floor at all, and ``--floor`` runs the read scenarios only.

    python -m bench.floor --port 8082 --shapes shapes.json --log floor.log
"""

import hmac
import queue
import re
import threading
import time
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from bench.baseline import Shape, View, add_routes, arguments, load_shapes, serve
from keysvc.credentials import Hasher
from keysvc.middleware import new_request_id
from keysvc.observability import route_template

_REQUEST_ID = re.compile(rb'"requestId": "[0-9a-f-]{36}"')
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
GATHER_SECONDS = 0.02  # as keysvc.logs: the writer lets lines gather this long


class Floor:
    """The per-request work, and the state it needs."""

    def __init__(self, log: Path):
        self.hasher = Hasher(b"floor-pepper-" * 3)
        # The header's keyed hash -> the secret hash it was proven with, and the caller.
        self.seen: dict[bytes, tuple[bytes, str]] = {}
        self.keys: dict[str, bytes] = {}  # caller -> its secret hash, as a cache holds it
        self.failures: dict[str | None, int] = {}
        self.counts: dict[tuple[str, str, int], int] = {}
        self.lines: queue.SimpleQueue[tuple[float, str, str, str, int, float, str]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._write, args=(log,), daemon=True).start()

    def _write(self, log: Path) -> None:
        with log.open("a") as out:
            while True:
                batch = [self.lines.get()]
                time.sleep(GATHER_SECONDS)
                while True:
                    try:
                        batch.append(self.lines.get_nowait())
                    except queue.Empty:
                        break
                out.write(
                    "".join(
                        f'{{"time": {at:.3f}, "requestId": "{rid}", "method": "{method}",'
                        f' "route": "{route}", "status": {status},'
                        f' "latencyMs": {1000 * seconds:.3f}, "caller": "{caller}"}}\n'
                        for at, rid, method, route, status, seconds, caller in batch
                    )
                )
                out.flush()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = new_request_id()
        request[REQUEST_ID] = request_id
        if self.failures.get(request.remote, 0) >= 20:
            raise web.HTTPTooManyRequests()
        header = request.headers.get("Authorization", "")
        proof = self.hasher.of_header(header)
        proven = self.seen.get(proof)
        if proven is None:  # taken as proven: the floor measures the steady state
            proven = self.seen[proof] = (self.hasher.of_plain(header), header[-8:])
            self.keys[proven[1]] = proven[0]
        # The key as cached now must still hold the secret hash the header was proven with.
        if not hmac.compare_digest(self.keys.get(proven[1], b""), proven[0]):
            raise web.HTTPUnauthorized()
        response = await handler(request)
        response.headers["X-Request-Id"] = request_id
        route = route_template(request)  # as keysvc's access record and metrics
        labels = (route, request.method, response.status)
        self.counts[labels] = self.counts.get(labels, 0) + 1
        seconds = time.perf_counter() - started
        line = (time.time(), request_id, request.method, route, response.status, seconds)
        self.lines.put((*line, proven[1]))
        return response


def _replay(shape: Shape) -> View:
    head, *rest = _REQUEST_ID.split(shape.body)
    tail = rest[0] if rest else None

    async def view(request: web.Request) -> web.Response:
        if request.can_read_body:
            await request.read()
        body = shape.body
        if tail is not None:
            body = head + f'"requestId": "{request[REQUEST_ID]}"'.encode() + tail
        return web.Response(status=shape.status, headers=shape.headers, body=body)

    return view


FLOOR = web.AppKey("floor", Floor)


def create_app(shapes: dict[str, Shape], log: Path) -> web.Application:
    floor = Floor(log)
    app = web.Application(middlewares=[floor.middleware])
    app[FLOOR] = floor
    return add_routes(app, shapes, _replay)


def main() -> None:
    parser = arguments("The benchmark's floor: A plus the least work.")
    parser.add_argument("--log", type=Path, required=True, help="the access lines' file")
    args = parser.parse_args()
    serve(create_app(load_shapes(args.shapes), args.log), args)


if __name__ == "__main__":
    main()
