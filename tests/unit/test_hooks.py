"""Notifications (gpupin.hostagent.serve.hooks): the command gets one JSON object on stdin, a hanging or failing hook
never holds the caller and is said once, the webhook gets the same object, and the command runs as --hook-user."""

from __future__ import annotations

import json
import os
import pwd
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.serve.hooks import Hooks

PAYLOAD = {
    "card": {"uuid": "GPU-a", "index": 0, "name": "Fake"},
    "container": {"id": "c1", "name": "train", "image": "img:1"},
    "user": {"uid": 1000, "name": "alice"},
}


def recorder(tmp_path: Path, extra: str = "") -> list[str]:
    """A hook that appends its stdin (one line per call) to tmp_path/got, after `extra` (shell)."""
    script = tmp_path / "hook.sh"
    script.write_text(f'#!/bin/sh\n{extra}\ncat >> "{tmp_path}/got"; echo >> "{tmp_path}/got"\n')
    script.chmod(0o755)
    return [str(script)]


def got(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "got"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln] if path.exists() else []


def test_command_gets_the_event_on_stdin(tmp_path: Path) -> None:
    h = Hooks()
    h.configure(recorder(tmp_path), None)
    h.emit("card.unhealthy", {**PAYLOAD, "reasons": ["XID 79"]})
    assert h.wait_idle(20)
    (obj,) = got(tmp_path)
    assert obj["event"] == "card.unhealthy" and obj["host"] == os.uname().nodename
    assert obj["container"] == PAYLOAD["container"] and obj["reasons"] == ["XID 79"]
    assert abs(obj["time"] - time.time()) < 20


def test_hanging_hook_never_holds_the_caller(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hook that hangs: emit returns at once, the hook is killed at its limit (its children too), the failure
    is said once, and the events behind it still reach the hook."""
    marker = tmp_path / "child"
    h = Hooks(limit=1.0)
    h.configure(recorder(tmp_path, f'[ -e "{tmp_path}/hang" ] && {{ (sleep 60; touch {marker}) & sleep 60; }}'), None)
    (tmp_path / "hang").touch()
    started = time.monotonic()
    for _ in range(50):
        h.emit("queue.turn", PAYLOAD)
    assert time.monotonic() - started < 5  # an emit that waited for the hook would take its 1 s limit: 50 s
    time.sleep(2.5)
    (tmp_path / "hang").unlink()
    assert h.wait_idle(120)
    err = capsys.readouterr().err
    assert err.count("notify command failed") == 1 and "killed" in err
    assert "works again" in err and len(got(tmp_path)) >= 40
    assert not marker.exists()


def test_failing_and_missing_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = Hooks()
    h.configure([str(tmp_path / "missing")], None)
    h.emit("card.lost", PAYLOAD)
    h.emit("card.lost", PAYLOAD)
    assert h.wait_idle(20)
    assert capsys.readouterr().err.count("cannot run") == 1
    h.configure(["/bin/false"], None)
    h.emit("card.lost", PAYLOAD)
    assert h.wait_idle(20)
    assert "exit status 1" in capsys.readouterr().err


def test_webhook_gets_a_post() -> None:
    bodies: list[bytes] = []

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = Hooks()
        h.configure(None, f"http://127.0.0.1:{server.server_port}/gpupin")
        h.emit("booking.ending", {**PAYLOAD, "left_s": 900})
        assert h.wait_idle(20)
        assert json.loads(bodies[0])["left_s"] == 900
    finally:
        server.shutdown()


def test_runs_as_hook_user() -> None:
    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody")
    tmp_path = Path(tempfile.mkdtemp(prefix="gpupin-hook-"))  # pytest's own folder is root's alone
    os.chmod(tmp_path, 0o777)
    try:
        _as_nobody(tmp_path, nobody.pw_uid)
    finally:
        shutil.rmtree(tmp_path)


def _as_nobody(tmp_path: Path, uid: int) -> None:
    h = Hooks()
    h.run_as("nobody")
    h.configure(recorder(tmp_path, f'id -u > "{tmp_path}/uid"'), None)
    h.emit("queue.turn", PAYLOAD)
    assert h.wait_idle(20)
    assert (tmp_path / "uid").read_text().strip() == str(uid)
    from gpupin.core.errors import UsageError

    with pytest.raises(UsageError, match="no user"):
        h.run_as("no-such-user-here")
