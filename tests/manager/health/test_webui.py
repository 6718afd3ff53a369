"""doctor's web UI lines: the build state and whether the port is free."""

from __future__ import annotations

import json
import os
import socket

from manager.health import webui
from manager.health.check import Status
from manager.paths import Paths


def test_an_unbuilt_ui_warns_with_sync_as_the_fix():
    check = webui.judge_build(False, "needs a build: not built yet")
    assert check.status is Status.WARN and "sync" in check.fix


def test_a_port_held_by_another_program_warns_and_a_free_one_is_ok():
    with socket.socket() as busy:
        busy.bind((webui.HOST, 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert not webui.port_free(webui.HOST, port)
        check = webui.judge_port(False, None, port)
        assert check.status is Status.WARN and f"{port}" in check.detail
        assert "--port" in check.fix
    assert webui.judge_port(True, None, port).status is Status.OK


def test_this_checkouts_running_server_is_ok_and_named(tmp_path):
    from aitk_common import procs

    (tmp_path / ".aitk-ui").mkdir()
    record = tmp_path / ".aitk-ui" / "server.json"
    me = procs.current().to_json()  # the record names the server by pid and start time
    record.write_text(json.dumps({"process": me, "pid": os.getpid(),
                                  "url": "http://127.0.0.1:8676/", "port": 8676}))
    ours = webui.running_server(Paths(tmp_path))
    assert ours is not None
    check = webui.judge_port(False, ours, 8676)
    assert check.status is Status.OK and "http://127.0.0.1:8676/" in check.detail
    record.write_text(json.dumps({"pid": 2**22 + 7}))
    assert webui.running_server(Paths(tmp_path)) is None  # a stale record
    record.write_text(json.dumps({"process": {**me, "started": "another start"},
                                  "pid": os.getpid()}))
    assert webui.running_server(Paths(tmp_path)) is None  # its pid, reused by another
