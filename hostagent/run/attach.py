"""Following a container in the foreground, as `docker run` does: its output, this process's input (`-i`), a TTY in
raw mode that follows this terminal's window size (`-t`), signals (`--sig-proxy`) and its exit code. The streams
are attached, and the exit waited for on a connection of its own, before the container starts, so that no output
and no quick exit (`--rm`) is missed. Signals: docs/run.md, "What it does".
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent import engine, mark, say, start_thread
from gpupin.hostagent.engine.unix import STDERR

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.engine.unix import ExitWait, Stream, UnixClient
    from gpupin.hostagent.run.request import RunRequest


class Follow:
    """What following a container reads of `hostagent run`'s options (-d, -i, -t, --rm, --sig-proxy,
    --stop-timeout), taken from the RunRequest."""

    __slots__ = ("detach", "interactive", "rm", "sig_proxy", "stop_timeout", "tty")

    def __init__(
        self, detach: bool, interactive: bool, tty: bool, rm: bool, sig_proxy: bool, stop_timeout: int | None
    ) -> None:
        self.detach = detach
        self.interactive = interactive
        self.tty = tty
        self.rm = rm
        self.sig_proxy = sig_proxy
        self.stop_timeout = stop_timeout

    @classmethod
    def of(cls, req: RunRequest) -> Follow:
        return cls(req.detach, req.interactive, req.tty, req.rm, req.sig_proxy, req.stop_timeout)


class Attachment:
    """The container's streams and its exit, opened before it starts (`open`), followed after (`follow`), through
    the client of its transport (gpupin.hostagent.engine.follower): the same follow whoever created it."""

    def __init__(self, cid: str, req: Follow, api: UnixClient) -> None:
        self.cid = cid
        self.req = req
        self.api = api
        self.result: DaemonAnswer = {}
        self._stream: Stream | None = None
        self._waiter: threading.Thread | None = None

    def open(self) -> None:
        # No read timeout on the streams: a quiet workload may print nothing for hours.
        self._stream = self.api.attach(self.cid, stdin=self.req.interactive, tty=self.req.tty)
        # The wait is registered (the daemon has sent its answer's head) before the start: a quick exit, and --rm's
        # removal, cannot be missed.
        waiting: ExitWait = self.api.wait(self.cid, "removed" if self.req.rm else "next-exit")

        def wait() -> None:
            try:
                self.result.update(waiting.result())
            except Exception as err:  # reported by follow(), which then asks the daemon itself
                self.result["Error"] = {"Message": str(err)}

        self._waiter = start_thread(wait, "hostagent-wait")

    def close(self) -> None:
        """Let go of the streams (a start that failed)."""
        if self._stream is not None:
            self._stream.close()

    # --- the streams ----------------------------------------------------------------------------------------

    def _output(self) -> Iterator[tuple[int, bytes]]:
        assert self._stream is not None
        yield from self._stream.frames()

    def _pump_stdin(self) -> None:
        """This process's input to the container's, then EOF (the container's stdin closes, as with docker run)."""
        assert self._stream is not None
        fd = sys.stdin.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                self._stream.send(data)
            self._stream.close_input()
        except OSError:
            pass  # the container went away first

    def _resize(self) -> None:
        try:
            size = os.get_terminal_size(sys.stdout.fileno())
        except OSError:
            return
        with contextlib.suppress(Exception):
            self.api.resize(self.cid, height=size.lines, width=size.columns)

    def _follow_window(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Start the thread that keeps the container's TTY at this terminal's size; return what SIGWINCH calls and
        what ends the thread.
        The handler only writes a byte to a pipe: asking the daemon from it would stall the output loop it
        interrupts for as long as a busy daemon takes to answer (in CI, long enough that the shell seemed frozen).
        A pipe, not a lock, because a second SIGWINCH can interrupt the first one's handler; a burst of window
        changes is read as one and becomes one request for the last size."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)

        def resize_on_change() -> None:
            while os.read(wake_r, 512):  # b"": the write end was closed
                self._resize()
            os.close(wake_r)

        def window_changed() -> None:
            with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
                os.write(wake_w, b"w")

        start_thread(resize_on_change, "hostagent-resize")
        return window_changed, lambda: os.close(wake_w)

    # --- signals -------------------------------------------------------------------------------------------

    def _on_signal(self, seen: list[int], signum: int) -> None:
        seen.append(signum)
        proxy = self.req.sig_proxy and not self.req.tty
        actions = ("forward", "stop", "kill") if proxy else ("stop", "kill")
        action = actions[min(len(seen), len(actions)) - 1]
        name = signal.Signals(signum).name
        if action == "stop":
            say(f"{name}: stopping {self.cid[:12]} (again: kill it)")
        elif action == "kill":
            say(f"{name}: killing {self.cid[:12]}")

        def act() -> None:
            # It may have exited or gone already: the waiter reports how it ended.
            with contextlib.suppress(Exception):
                if action == "forward":
                    self.api.kill(self.cid, signal=signum)
                elif action == "stop":
                    self.api.stop(self.cid, timeout=self.req.stop_timeout)
                else:
                    self.api.kill(self.cid)

        start_thread(act, f"hostagent-{action}")

    # --- following -------------------------------------------------------------------------------------------

    def follow(self) -> int:
        """Stream until the container exits; return its exit code (125 when it cannot be learned)."""
        assert self._waiter is not None, "open() before start"
        seen: list[int] = []
        handlers = {
            s: signal.signal(s, lambda signum, _f: self._on_signal(seen, signum))
            for s in (signal.SIGINT, signal.SIGTERM)
        }
        restore_tty = None
        stop_following_window: Callable[[], None] | None = None
        assert self._stream is not None
        try:
            if self.req.tty:
                restore_tty = _raw_terminal()
                self._resize()  # before the first output, as docker run does
                window_changed, stop_following_window = self._follow_window()
                handlers[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, lambda _s, _f: window_changed())
            if self.req.interactive:
                start_thread(self._pump_stdin, "hostagent-stdin")
            try:
                for stream, data in self._output():
                    fh = sys.stderr if stream == STDERR else sys.stdout
                    fh.buffer.write(data)
                    fh.flush()
            except Exception as err:  # the daemon dropped the stream: how it ended is asked below
                if not engine.is_daemon_failure(err):
                    raise
            while self._waiter.is_alive():
                self._waiter.join(0.2)
        finally:
            self._stream.close()
            if restore_tty is not None:
                restore_tty()
            for s, h in handlers.items():
                signal.signal(s, h)
            if stop_following_window is not None:
                stop_following_window()
        code = self._exit_code()
        mark("exited")
        return code

    def _exit_code(self) -> int:
        code = self.result.get("StatusCode")
        if code is None:
            try:
                code = self.api.inspect(self.cid)["State"]["ExitCode"]
            except Exception as err:
                lost = (self.result.get("Error") or {}).get("Message") or str(err)
                raise DockerUnavailableError(
                    f"lost the Docker daemon at {engine.docker_host()} while following {self.cid[:12]}: {lost}",
                    f"the container may still be running: `docker ps -a --filter id={self.cid[:12]}`, "
                    "then `docker logs` or `docker wait` it",
                ) from None
        return int(code)


def _raw_terminal() -> Any:
    """Put this terminal in raw mode (keys go to the container as typed, Ctrl-C included); return the undo."""
    if not os.isatty(sys.stdin.fileno()):
        return None
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    return lambda: termios.tcsetattr(fd, termios.TCSADRAIN, saved)
