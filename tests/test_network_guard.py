"""The network guard (tests/network_guard.py): which hosts count as this machine, and a
small pytest session showing a test that reaches further fails even when the code under
test takes the refusal for a network that is down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.network_guard import is_local

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("host", [None, "", "localhost", "LOCALHOST.", "127.0.0.1",
                                  "127.1.2.3", "::1", "0.0.0.0", "::", b"127.0.0.1"])
def test_this_machine(host):
    assert is_local(host)


@pytest.mark.parametrize("host", ["huggingface.co", "10.0.0.1", "192.168.1.2", "8.8.8.8",
                                  "2001:4860:4860::8888", "localhost.example.com"])
def test_elsewhere(host):
    assert not is_local(host)


TESTS = '''
import socket

import pytest


def test_loopback_is_fine():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname(), timeout=5)
    client.close()
    server.close()


def test_a_lookup_is_refused():
    with pytest.raises(OSError):
        socket.getaddrinfo("huggingface.co", 443)


def test_a_refusal_caught_as_offline_still_fails():
    sock = socket.socket()
    sock.settimeout(1)
    try:
        sock.connect(("10.255.255.1", 80))
    except OSError:
        pass  # what a client does with a network that is down
    finally:
        sock.close()
'''


def test_a_test_that_reaches_another_host_fails(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir
    (tmp_path / "test_net.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.network_guard",
                           "-p", "no:cacheprovider", "-p", "no:xdist", "-rA",
                           "test_net.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "2 failed, 1 passed" in out, out
    assert "PASSED test_net.py::test_loopback_is_fine" in out
    for name, what in (("test_a_lookup_is_refused", "looks up 'huggingface.co'"),
                       ("test_a_refusal_caught_as_offline_still_fails",
                        "connects to '10.255.255.1'")):
        assert f"FAILED test_net.py::{name}" in out
        assert f"test_net.py::{name} {what}: tests reach this machine only" in out
