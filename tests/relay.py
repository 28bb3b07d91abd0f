"""A loopback HTTP/1.1 relay in front of a real keysvc that can lose an answer: each
request a client sends goes to keysvc and keysvc's answer comes back, except that while
``drops`` is above zero the relay passes the request on, reads keysvc's whole answer
(keysvc has acted on it), and closes the client's connection instead of answering, as a
proxy or a keysvc gone between its COMMIT and its answer does. ``methods`` lists the
method of every request that reached keysvc, ``heads`` its head (request line and
headers)."""

import asyncio
import re
from typing import Self

LENGTH = re.compile(rb"^content-length:\s*(\d+)\s*$", re.I | re.M)


async def _message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 message (head and a Content-Length body); b"" at the end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = LENGTH.search(head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return head + body


class Relay:
    def __init__(self, port: int) -> None:
        self.upstream = port
        self.drops = 0
        self.methods: list[str] = []
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None

    @property
    def base(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        keysvc_in, keysvc_out = await asyncio.open_connection("127.0.0.1", self.upstream)
        try:
            while request := await _message(client_in):
                self.methods.append(request.split(b" ", 1)[0].decode())
                self.heads.append(request.partition(b"\r\n\r\n")[0])
                keysvc_out.write(request)
                await keysvc_out.drain()
                answer = await _message(keysvc_in)
                if self.drops > 0:
                    self.drops -= 1
                    break
                client_out.write(answer)
                await client_out.drain()
        finally:
            client_out.close()
            keysvc_out.close()
