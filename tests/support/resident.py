"""A resident agent (`hostagent serve`) for the tests: started as users start it, on a socket and a port of its own,
waited for until it answers, and stopped with SIGTERM, which must end it with exit 0 within 5 s."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.host import HOSTAGENT
from tests.support.wait import wait_for

STOP_LIMIT = 5.0  # seconds SIGTERM may take (docs/serve.md)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Resident:
    """`hostagent serve` in a process of its own; `get(path)` reads its HTTP API."""

    def __init__(
        self,
        env: dict[str, str],
        *args: str,
        directory: Path | None = None,
        wrap: tuple[str, ...] = (),
        stderr: int | None = subprocess.PIPE,
    ) -> None:
        """`directory`: the socket's (and the queue file's), e.g. an earlier agent's, to start it again there;
        `wrap`: a command that execs the agent (prlimit, setpriv: its pid stays the agent's)."""
        self.dir = directory or Path(tempfile.mkdtemp(prefix="gpupin-serve-"))
        if wrap:
            os.chmod(self.dir, 0o777)  # an agent started as another user makes its socket there
        self.socket = str(self.dir / "agent.sock")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if not any(a == "--record" or a.startswith("--record=") for a in args):
            # The record beside the socket (never the host's /var/lib/gpupin); none for an agent of another user,
            # whose folder here is everyone's (the agent refuses a record there).
            args = ("--record", "none" if wrap else str(self.dir / "record.db"), *args)
        self.argv = [*wrap, HOSTAGENT, "serve", "--socket", self.socket, "--http", f"127.0.0.1:{self.port}", *args]
        self.socket_left = False
        self.stderr = ""  # its log, once stopped
        self.env = env
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        wait_for(self._up, 30, "the agent to listen")

    def restart(self) -> None:
        """Start it again after kill(), as systemd's Restart= does: the same command line, socket and port."""
        assert self.proc.poll() is not None, "the agent still runs"
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(self._up, 30, "the agent to listen again")

    def rss(self) -> int:
        """Its resident memory now, in bytes (VmRSS: what `ps` and the OOM killer count)."""
        return self._status("VmRSS") * 1024

    def threads(self) -> int:
        return self._status("Threads")

    def fds(self) -> int:
        """How many files it has open (sockets included)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def _status(self, field: str) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith(f"{field}:")))

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"hostagent serve exited {self.proc.returncode}: {self.proc.communicate()}")
        try:
            return self.get("/api/agent")[0] == 200
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        """The user and system time it has used so far (/proc/PID/stat)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def get(self, path: str, unix: bool = False, timeout: float = 10) -> tuple[int, bytes, str]:
        """(status, body, content type) of GET `path`, over TCP or the unix socket."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(self.socket)
            conn.sock = sock
        try:
            conn.request("GET", path)
            res = conn.getresponse()
            return res.status, res.read(), res.getheader("Content-Type") or ""
        finally:
            conn.close()

    def ls(self) -> dict[str, Any]:
        status, body, _ = self.get("/api/ls")
        assert status == 200, body
        data: dict[str, Any] = json.loads(body)
        return data

    def card(self, uuid: str) -> dict[str, Any]:
        return next(g for g in self.ls()["gpus"] if g["uuid"] == uuid)

    def stop(self) -> tuple[int, float, str]:
        """SIGTERM: (exit code, seconds it took, stderr)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=STOP_LIMIT + 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        took = time.monotonic() - started
        self.stderr = err or ""
        self.socket_left = os.path.exists(self.socket)
        if self.socket_left:
            os.unlink(self.socket)
        shutil.rmtree(self.dir)  # with the queue's file (gpupin.hostagent.serve.queue), kept for a restart
        return self.proc.returncode, took, err

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """SIGKILL, as a crash (or SIGTERM, as a restart's stop): the queue's file stays (and after a crash the
        socket), for an agent started again in `dir`."""
        self.proc.send_signal(signum)
        self.proc.communicate(timeout=STOP_LIMIT + 5)

    def close(self) -> None:
        """Stop it and require what docs/serve.md promises: exit 0 within 5 s, its socket removed."""
        if self.proc.poll() is not None:
            return
        code, took, err = self.stop()
        assert code == 0 and took < STOP_LIMIT and not self.socket_left, (code, took, self.socket_left, err)
