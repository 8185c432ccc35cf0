"""Notifications: `Hooks.emit(event, payload)` hands one JSON object to the policy's notify command (on its stdin)
and to its loopback webhook (a POST), from a worker thread, so that the agent never waits on a hook: a bounded
queue, one call at a time within LIMIT_S, a failure said once. The command runs with a bare environment, as root
or `--hook-user`. Events, payloads and who emits each: docs/serve.md, "Notifications".
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time

from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject

EVENTS = (
    "booking.ending",
    "booking.ended",
    "idle.warning",
    "idle.stopped",
    "card.unhealthy",
    "card.lost",
    "queue.turn",
)
LIMIT_S = 10.0  # each call of the command or the webhook, at most
QUEUED = 1000  # events waiting for the worker, at most
MAX_PAYLOAD = 1 << 20


class Hooks:
    """The notify rule in force and the worker that calls it."""

    def __init__(self, limit: float = LIMIT_S) -> None:
        self.limit = limit
        self.command: list[str] | None = None
        self.webhook: str | None = None
        self.user: tuple[int, int, list[int]] | None = None  # uid, gid, groups of --hook-user (None: root's own)
        self.host = socket.gethostname()
        self._queue: queue.Queue[JSONObject] = queue.Queue(QUEUED)
        self._failing: set[str] = set()  # "command", "webhook": failed last time (said once)
        self._dropped = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.calls = 0  # calls made (tests, metrics)
        self._running: subprocess.Popen[bytes] | None = None  # the command being called now

    def apply(self, rule: Any) -> None:
        """The policy's NotifyRule (command, webhook; None: no hooks), at load and at each reload."""
        self.configure(getattr(rule, "command", None), getattr(rule, "webhook", None))

    def configure(self, command: list[str] | None, webhook: str | None) -> None:
        """The policy's notify rule (None, None: no hooks), as gpupin.hostagent.policy checked it (an absolute
        program; a loopback http:// webhook)."""
        command = list(command) if command else None
        if (command, webhook) != (self.command, self.webhook):
            self._failing.clear()  # another hook: its first failure is said again
        self.command, self.webhook = command, webhook

    def run_as(self, name: str | None) -> None:
        """`serve --hook-user NAME`: the command's user and groups (UsageError, 64, for an unknown user)."""
        if name is None:
            self.user = None
            return
        import grp
        import pwd

        from gpupin.core.errors import UsageError, shown

        try:
            pw = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
        except KeyError:
            raise UsageError(f"--hook-user: no user {shown(name)}", "name a user of this host") from None
        groups = sorted({g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem} | {pw.pw_gid})
        self.user = (pw.pw_uid, pw.pw_gid, groups)

    @property
    def active(self) -> bool:
        return bool(self.command or self.webhook)

    def emit(self, event: str, payload: JSONObject) -> None:
        """Queue one event for the hooks (nothing when none is set); never waits."""
        if not self.active:
            return
        obj = {"event": event, "time": time.time(), "host": self.host, **payload}
        try:
            self._queue.put_nowait(obj)
        except queue.Full:
            if not self._dropped:
                say(f"notify: {QUEUED} events wait for a hook already; {event} and the next ones are dropped")
            self._dropped = True
            return
        self._dropped = False
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="hooks", daemon=True)
                self._thread.start()

    def wait_idle(self, timeout: float) -> bool:
        """Until the queue is empty and its last call done (tests, stop); whether it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.02)
        return False

    def _work(self) -> None:
        while True:
            try:
                obj = self._queue.get(timeout=5.0)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                data = json.dumps(obj).encode()[:MAX_PAYLOAD]
                command, webhook = self.command, self.webhook
                if command:
                    self._outcome("command", obj["event"], self._call(command, data))
                if webhook:
                    self._outcome("webhook", obj["event"], self._post(webhook, data))
            except Exception as err:  # a bug here must not end the worker: the next event is tried
                say(f"notify: internal error: {type(err).__name__}: {err}")
            finally:
                self.calls += 1
                self._queue.task_done()

    def _outcome(self, what: str, event: str, error: str | None) -> None:
        if error is None:
            if what in self._failing:
                self._failing.discard(what)
                say(f"notify {what} works again")
            return
        if what not in self._failing:
            self._failing.add(what)
            say(f"notify {what} failed on {event}: {error} (said once, until it works again)")

    def _call(self, argv: list[str], data: bytes) -> str | None:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            uid, gid, groups = self.user
            kwargs = {"user": uid, "group": gid, "extra_groups": groups}
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,  # its own process group: killed whole at the limit
                close_fds=True,
                **kwargs,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            return f"cannot run {argv[0]!r}: {getattr(err, 'strerror', None) or err}"
        self._running = proc
        try:
            proc.communicate(data, timeout=self.limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"still running after {self.limit:g}s: killed"
        except OSError:  # it closed its stdin early: its exit status says whether it worked
            proc.wait()
        finally:
            self._running = None
        if proc.returncode != 0:
            return f"exit status {proc.returncode}"
        return None

    def stop(self) -> None:
        """The agent stops: a command still running is killed with its process group (it would outlive the agent,
        in a session of its own); the events still queued are dropped."""
        proc = self._running
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _post(self, url: str, data: bytes) -> str | None:
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=self.limit)
        try:
            conn.request(
                "POST",
                (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                body=data,
                headers={"Content-Type": "application/json"},
            )
            status = conn.getresponse().status
        except (OSError, http.client.HTTPException) as err:
            return f"{url}: {err}"
        finally:
            conn.close()
        return None if 200 <= status < 300 else f"{url} answered {status}"
