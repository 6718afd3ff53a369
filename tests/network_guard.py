"""A pytest plugin: tests talk to this machine only (docs/testing.md).

Network traffic in tests goes to 127.0.0.1 alone: loopback package indexes, loopback
download servers, the web UI on 127.0.0.1. A test that reaches further (a hub id looked
up because an offline switch was read too late, a mirror's real host name) passes on a
machine without a network and hangs or fails on CI's. So for the whole session the
socket layer is wrapped: a connection (TCP or UDP) to an address that is not loopback,
or a name lookup of a host that is not this machine, is refused with `NetworkInTest`,
and the test is reported as failed even if the code under test caught that error (most
do: to them it is the network being down). Processes the tests start are not covered.
Loaded by tests/conftest.py; `-p tests.network_guard` loads it into any pytest run.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from tests.guard_hooks import Guard, add_hooks

# Names that resolve to this machine without asking a resolver (the hosts file).
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                         "ip6-loopback"})
INET = (socket.AF_INET, socket.AF_INET6)


class NetworkInTest(OSError):
    """A test tried to reach a host other than this machine."""


def is_local(host: object) -> bool:
    """Whether `host` (a name, an address or None, as sockets take them) is this machine:
    loopback, or the unspecified address a server binds to."""
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name.lower().rstrip(".") in LOCAL_NAMES or name == "":
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])  # an IPv6 zone: fe80::1%eth0
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


class NetworkGuard(Guard):
    def __init__(self) -> None:
        super().__init__()
        self._real = (socket.socket.connect, socket.socket.connect_ex,
                      socket.socket.sendto, socket.getaddrinfo)

    def install(self) -> None:
        guard = self
        connect, connect_ex, sendto, getaddrinfo = self._real

        def guarded_connect(sock: socket.socket, address: Any) -> None:
            __tracebackhide__ = True
            guard.check_address(sock, address)
            return connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
            __tracebackhide__ = True
            guard.check_address(sock, address)
            return connect_ex(sock, address)

        def guarded_sendto(sock: socket.socket, data: Any, *rest: Any) -> int:
            __tracebackhide__ = True
            guard.check_address(sock, rest[-1])
            return sendto(sock, data, *rest)

        def guarded_getaddrinfo(host: Any, *rest: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            guard.check(host, "looks up")
            return getaddrinfo(host, *rest, **kwargs)

        socket.socket.connect = guarded_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
        socket.socket.sendto = guarded_sendto  # type: ignore[method-assign]
        socket.getaddrinfo = guarded_getaddrinfo  # type: ignore[assignment]

    def uninstall(self) -> None:
        (socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto,
         socket.getaddrinfo) = self._real  # type: ignore[method-assign]

    def check_address(self, sock: socket.socket, address: Any) -> None:
        __tracebackhide__ = True
        if sock.family in INET and isinstance(address, tuple) and address:
            self.check(address[0], "connects to")

    def check(self, host: object, what: str) -> None:
        __tracebackhide__ = True
        if self.item is None or is_local(host):
            return
        message = (f"{self.item.nodeid} {what} {host!r}: tests reach this machine only "
                   "(127.0.0.1; serve what it needs from a loopback server, or switch "
                   "the client offline; docs/testing.md)")
        self.refused.append(message)
        raise NetworkInTest(message)


_guard = NetworkGuard()


def pytest_configure(config: pytest.Config) -> None:
    _guard.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    _guard.uninstall()


add_hooks(globals(), _guard)
