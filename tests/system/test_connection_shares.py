"""Who may hold a real ``keysvc serve``'s connection slots (keysvc.http.shares): one
client address at most ``KEYSVC_MAX_CONNECTIONS_PER_ADDRESS`` TCP connections, a
trusted proxy's excepted; and with a unix socket served too, a tenth of the cap
kept for it. Other loopback addresses (127.0.0.2) stand for other clients: Linux
answers the whole of 127.0.0.0/8 on the loopback interface."""

import socket
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.server import Server, UnixHTTPConnection, bootstrap
from tests.system.rawconn import (
    HEALTHZ,
    PARTIAL,
    WITHIN,
    answers_again,
    closed_by_server,
    connect,
    read_answer,
    wait_for_log,
)


@pytest.fixture(autouse=True)
def _database(tmp_path: Path) -> None:
    bootstrap(tmp_path / "k.db")


def served(sock: socket.socket) -> bool:
    """Whether a request on ``sock`` is answered 200 (False: the server closed it)."""
    try:
        sock.sendall(HEALTHZ)
        status, _, _ = read_answer(sock)
    except (AssertionError, ConnectionError):
        return False
    return status == 200


# A head never finished, so that each connection stays open and idle.
HELD = {"KEYSVC_HEADER_TIMEOUT": "600"}


def test_one_address_holds_at_most_half_and_the_others_their_share(tmp_path: Path) -> None:
    """Cap 10, share 2: one address takes its 2 and the 3 past shares that half of
    TCP leaves (5), then no more; another gets its 2, a third its own; a slot given
    back is its address's again."""
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "2", "KEYSVC_MAX_CONNECTIONS": "10"}
    with Server(tmp_path / "k.db", env=env) as server, ExitStack() as stack:
        first = [stack.enter_context(connect(server.port, PARTIAL, "127.0.0.1")) for _ in range(8)]
        # Each one past the share is closed as soon as it is accepted; the others are kept.
        refused = closed_by_server(first, WITHIN, 3)
        assert len(refused) == 3
        held = [sock for sock in first if sock not in refused]
        assert closed_by_server(held, 1.0) == []
        second = [stack.enter_context(connect(server.port, source="127.0.0.2")) for _ in range(3)]
        assert len(closed_by_server(second, WITHIN, 1)) == 1
        with connect(server.port, source="127.0.0.3") as third:
            assert served(third)
        # One of the second address's closed: its slot is that address's again.
        kept = next(sock for sock in second if served(sock))
        kept.close()
        deadline = time.monotonic() + WITHIN
        while True:
            with connect(server.port, source="127.0.0.2") as again:
                if served(again):
                    break
            assert time.monotonic() < deadline, "the slot given back was never taken again"
            time.sleep(0.1)
        lines = wait_for_log(server, "max-connections-per-address")
    assert lines[0]["level"] == "warning"
    assert lines[0]["remote"] == "127.0.0.1"
    # The pool past shares (half of TCP's 10, less a share of 2), drawn dry by it.
    assert "3 of the 3 past shares are held" in str(lines[0]["message"])


def test_a_host_past_its_share_is_not_held_back_by_others_within_theirs(
    tmp_path: Path,
) -> None:
    """rt49 F1, rt50 G1: a host with several client pools (more than its share) opens
    more while the others stay within their shares, however many connections those
    hold; alone, it takes up to half of TCP's slots."""
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "3", "KEYSVC_MAX_CONNECTIONS": "20"}
    with Server(tmp_path / "k.db", env=env) as server, ExitStack() as stack:
        host = [stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(7)]
        assert all(served(sock) for sock in host)
        others = [
            stack.enter_context(connect(server.port, source=f"127.0.0.{9 + n // 3}"))
            for n in range(6)
        ]
        assert all(served(sock) for sock in others)  # 13 of 20 open, each other at its 3
        more = [stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(3)]
        assert served(more[0]) and served(more[1]) and served(more[2])  # 10: half
        with connect(server.port, source="127.0.0.1") as late:
            assert closed_by_server([late], WITHIN) == [late]


def test_refused_connections_count_nothing_against_their_address(tmp_path: Path) -> None:
    """Closing everything gives the address its whole share back, however many were refused."""
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "2", "KEYSVC_MAX_CONNECTIONS": "10"}
    with Server(tmp_path / "k.db", env=env) as server:
        for _ in range(3):
            with ExitStack() as stack:
                socks = [
                    stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(8)
                ]
                assert len(closed_by_server(socks, WITHIN, 3)) == 3
            answers_again(server.port)
        with ExitStack() as stack:
            socks = [
                stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(5)
            ]
            assert all(served(sock) for sock in socks)


def test_a_trusted_proxy_is_held_to_the_cap_alone(tmp_path: Path) -> None:
    env = {
        **HELD,
        "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "2",
        "KEYSVC_MAX_CONNECTIONS": "20",
        "KEYSVC_TRUSTED_PROXIES": "127.0.0.1/32",
    }
    with Server(tmp_path / "k.db", env=env) as server, ExitStack() as stack:
        # More than half of TCP's 20, which an untrusted address never gets.
        socks = [stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(14)]
        assert all(served(sock) for sock in socks)


def _unix_healthz(path: Path) -> int:
    conn = UnixHTTPConnection(path)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_tcp_clients_cannot_take_the_unix_sockets_share(tmp_path: Path) -> None:
    """Cap 20 with the unix socket served: TCP holds at most 18 (a tenth kept), even
    from as many addresses as it likes, and the proxy's socket still answers."""
    unix = tmp_path / "keysvc.sock"
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS": "20", "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "100"}
    with Server(tmp_path / "k.db", env=env, unix=unix) as server, ExitStack() as stack:
        socks = [
            stack.enter_context(connect(server.port, PARTIAL, f"127.0.0.{2 + n % 5}"))
            for n in range(24)
        ]
        closed = closed_by_server(socks, WITHIN, 6)
        assert len(closed) == 6
        assert all(_unix_healthz(unix) == 200 for _ in range(3))
        assert wait_for_log(server, "unix socket's share")[0]["openConnections"] == 18


def test_without_a_unix_socket_tcp_has_the_whole_cap(tmp_path: Path) -> None:
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS": "20"}
    with Server(tmp_path / "k.db", env=env) as server, ExitStack() as stack:
        socks = [
            stack.enter_context(connect(server.port, PARTIAL, f"127.0.0.{2 + n % 5}"))
            for n in range(20)
        ]
        assert closed_by_server(socks, 1.0) == []
        with connect(server.port, source="127.0.0.9") as late:
            assert closed_by_server([late], WITHIN) == [late]


def test_each_kind_of_refusal_is_named_in_the_log(tmp_path: Path) -> None:
    """rt49 F5: one throttle for both kinds let an address refused at will hide that
    TCP as a whole was full (and the other way round)."""
    unix = tmp_path / "keysvc.sock"
    env = {**HELD, "KEYSVC_MAX_CONNECTIONS": "20", "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "2"}
    with Server(tmp_path / "k.db", env=env, unix=unix) as server, ExitStack() as stack:
        first = [stack.enter_context(connect(server.port, source="127.0.0.1")) for _ in range(11)]
        assert len(closed_by_server(first, WITHIN, 2)) == 2  # TCP's half is 9
        wait_for_log(server, "max-connections-per-address")
        others = [
            stack.enter_context(connect(server.port, source=f"127.0.0.{2 + n // 2}"))
            for n in range(12)
        ]
        assert len(closed_by_server(others, WITHIN, 3)) == 3  # 9 more fill TCP's 18
        assert wait_for_log(server, "unix socket's share")[0]["openConnections"] == 18
