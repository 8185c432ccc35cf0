"""`hostagent serve` from start to stop: check the options, read the policy, listen, start the agent's threads, read
the policy again on SIGHUP (systemd's reload), and on SIGTERM or Ctrl-C stop everything within a couple of seconds
and exit 0 (systemd's stop waits for that)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from gpupin.core.errors import EX_USAGE, UsageError, printable
from gpupin.hostagent import PROG
from gpupin.hostagent.policy import Policy, PolicyError, format_duration, policy_path
from gpupin.hostagent.serve import api, connections, listen, rights, say, services
from gpupin.hostagent.serve.agent import Agent
from gpupin.hostagent.serve.hooks import Hooks
from gpupin.hostagent.serve.policy_in_force import PolicyInForce

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socketserver

    from gpupin.hostagent.record.writer import RecordWriter


class _Stopped(BaseException):
    """SIGTERM or Ctrl-C while the agent starts: raised in the main thread from the signal handler, through whatever
    it waits on (BaseException, as KeyboardInterrupt, so that no `except Exception` on the way swallows it)."""


def run(
    socket_path: str,
    group: str | None,
    http: str,
    public: bool,
    idle_after: float,
    interval: float,
    http_hosts: list[str] | None = None,
    limits: connections.Limits | None = None,
    daemon_group: str | None = None,
    policy: str | None = None,
    record_path: str | None = None,
    hook_user: str | None = None,
    http_per_user: bool = False,
) -> int:
    address = listen.http_address(http, public)  # refused before anything is opened
    names = listen.host_names(http_hosts or [])
    gid = listen.group_id(group)
    rights.set_daemon_group(daemon_group)
    hooks = Hooks()
    hooks.run_as(hook_user)
    # What runs through the agent convert with (--mount, --ulimit, the create payload), imported here, on one thread:
    # the docker SDK's types import one another in a cycle that holds on one thread, but two request threads that
    # import them first at once meet it half made ("cannot import name 'EndpointConfig'", seen in CI).
    import docker.types  # noqa: F401

    # The policy first, before anything is made: a file with mistakes keeps the last good policy saved, else the
    # agent does not start (docs/policy.md, "Reloading").
    in_force = PolicyInForce(policy or policy_path())
    in_force.keep_in(_own_folder(record_path, socket_path))
    try:
        in_force.start()
    except PolicyError as err:
        _refuse(err)
        return EX_USAGE
    writer = _record(record_path, hooks)
    # The agent from its parts: the policy in force, the record's writer, the hooks (it makes the rest).
    agent = Agent(interval=interval, idle_after=idle_after, record=writer, hooks=hooks, in_force=in_force)
    handler = api.handler(agent, http_per_user)
    servers: list[socketserver.TCPServer] = [listen.unix_server(socket_path, gid, handler)]
    agent.queue.keep_in(os.path.dirname(os.path.abspath(socket_path)))  # its order survives a restart
    agent.bookings.keep_in(os.path.dirname(os.path.abspath(socket_path)))  # and the extensions of bookings
    agent.owners.keep_in(os.path.dirname(os.path.abspath(socket_path)))  # and whom it created each container for
    try:
        if address is not None:
            servers.append(listen.tcp_server(address, handler, names))
    except BaseException:
        _close(servers, socket_path)
        raise
    stop = threading.Event()
    serving = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if first and not serving.is_set():  # the first read may wait on a daemon that does not answer: abandon it
            raise _Stopped  # once: a second signal must not interrupt the stop itself

    reload = threading.Event()

    def on_hup(_signum: int, _frame: object) -> None:
        reload.set()  # read in the main loop (within 0.5 s), not in the handler: the writer's lock may be held

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    gate = api.acceptor(servers, limits or connections.Limits())
    try:
        if writer is not None:
            writer.start()  # the intervals an earlier agent left open, before the first view
        agent.start()
        services.Services(agent).start()  # a swarm service's booking, where this daemon is a manager
        gate.start()
        serving.set()
        where = [f"unix://{socket_path}"] + ([f"http://{_shown(address)}"] if address else [])
        say(f"listening on {' and '.join(where)} (pid {os.getpid()}, {_idle_said(in_force.policy, idle_after)})")
        while not stop.wait(0.5):
            if reload.is_set():
                reload.clear()
                say("SIGHUP: reading the policy again")
                agent.in_force.load()
        say("stopping")
    except _Stopped:
        say("stopping before the first view was read")
    finally:
        agent.stop()
        hooks.stop()
        if writer is not None:
            writer.stop()
            writer.store.close()
        gate.stop()
        _close(servers, socket_path)
        for s, handler_ in previous.items():
            signal.signal(s, handler_)
        from gpupin.core import nvml

        with contextlib.suppress(Exception):  # NVML was never opened, or is gone already
            nvml.shutdown()
    return 0


def _idle_said(policy: Policy, idle_after: float) -> str:
    """The idle time in force: the policy's [idle] after takes --idle-after's place (docs/serve.md)."""
    after = policy.idle.after if policy.idle is not None else idle_after
    # Exact: format_duration rounds down to its unit (90 s would read 1m).
    said = format_duration(after) if after % 60 == 0 else f"{after:g}s"
    return f"idle after {said}" + (", the policy's [idle]" if policy.idle is not None else "")


def _own_folder(record_path: str | None, socket_path: str) -> str:
    """Where the agent keeps its last good policy: the record's folder (the agent's own, and it outlives a reboot),
    else (`--record none`) the socket's."""
    from gpupin.hostagent.record.store import default_path

    if record_path == "none":
        return os.path.dirname(os.path.abspath(socket_path))
    return os.path.dirname(os.path.abspath(record_path or default_path()))


def _refuse(err: PolicyError) -> None:
    """A start on a policy with mistakes and no good one saved: one line per mistake (exit 64), nothing made."""
    last = len(err.mistakes) - 1
    for n, mistake in enumerate(err.mistakes):
        hint = (
            f"fix it (`hostagent policy check {printable(err.path)}`): the agent has no good policy of this host "
            "saved to keep meanwhile, and does not start without one"
            if n == last
            else None
        )
        sys.stderr.write(UsageError(mistake, hint).line(f"{PROG} serve"))


def _record(path: str | None, hooks: Hooks) -> RecordWriter | None:
    """The record's writer on PATH (None: `--record none`); a file or folder it may not use is refused (64) before
    anything listens."""
    from gpupin.hostagent.record.store import Store, default_path
    from gpupin.hostagent.record.writer import RecordWriter

    if path == "none":
        return None
    return RecordWriter(Store(path or default_path()), emit=hooks.emit)


def _shown(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _close(servers: list[socketserver.TCPServer], socket_path: str) -> None:
    for server in servers:
        server.server_close()
    with contextlib.suppress(OSError):
        os.unlink(socket_path)
