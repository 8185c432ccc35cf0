"""`hostagent setup authz`: put gpupin's authorization plugin into the Docker daemon's configuration, check it, and
take it out again (docs/authz.md, Install).

The daemon reads `authorization-plugins` from daemon.json at start and again on SIGHUP (moby's reloadConfig, every
engine since 1.x; `systemctl reload docker` sends the same signal), so nothing restarts and no container stops.
Two traps make the order matter, both measured on Engines 20.10, 26 and 28.5:
- a reload validates every listed plugin, and dockerd EXITS (15 s after the signal) when it cannot find one it has
  not reached before: the plugin must be serving before the reload, so setup asks it (Plugin.Activate) first
  and refuses when it is silent;
- while a listed plugin is down the daemon refuses every request (after ~30-45 s of retries each).
`docker info`'s Plugins.Authorization shows the list the daemon STARTED with, not what a reload applied: whether
the daemon asks gpupin now is seen from a probe that gpupin's plugin denies by contract (PROBE).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

from gpupin.core.errors import DockerUnavailableError, GpupinError, UsageError, quoted, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject


# The plugin's own names (gpupin.hostagent.authz's, equal by test): not imported, because doctor imports this module
# and the plugin's package sits on the agent's layers (tests/unit/test_import_rules.py: at most 8 deep).
PLUGIN = "gpupin"
SOCKET = f"/run/docker/plugins/{PLUGIN}.sock"
PLUGIN_CONTENT_TYPE = "application/vnd.docker.plugins.v1.2+json"
PROBE = "gpupin-authz-probe"
KEY = "authorization-plugins"
DAEMON_JSON = "/etc/docker/daemon.json"
PIDFILE = "/run/docker.pid"  # dockerd's default --pidfile (/var/run/docker.pid: /var/run is /run)
DENIED_BY = f"authorization denied by plugin {PLUGIN}"
FAILED = f"plugin {PLUGIN} failed"  # the daemon's words while the plugin does not answer
EX_NOT_ON = 1  # --check: gpupin is not on (or not proven on); a reload that did not take

DESCRIPTION = (
    "Install gpupin as the Docker daemon's authorization plugin (`authorization-plugins` in daemon.json), reload "
    "the daemon (SIGHUP to the pid in --pidfile: what `systemctl reload docker` sends), and check that the daemon "
    "now asks the plugin. The daemon then sends gpupin every API request before it acts on it, and gpupin denies "
    "a container that would take a held or busy card, or one that pins no card (--gpus all), with a line the "
    "user's docker CLI prints (docs/authz.md). WHILE THE PLUGIN PROCESS IS DOWN THE DAEMON REFUSES EVERY REQUEST "
    "(docker ps too, after 30-45 s of retries each), and a reload naming a plugin it cannot find stops the "
    "daemon: so setup refuses to turn it on unless the plugin answers at --socket, and the plugin runs under "
    "systemd, started before docker (`hostagent authz`). It does not make the docker group safe: a user who may "
    "run privileged containers or bind the host's / can leave any rule behind (docs/authz.md, What it stops)."
)
EPILOG = """--undo takes gpupin out the same way (other plugins and keys stay); --check changes nothing and says
whether the daemon asks gpupin now.
exit: 0 done (gpupin on; with --undo, off); 1 the daemon does not ask gpupin (--check), or the reload did not
take; 64 bad usage or a daemon.json that is not a JSON object; 69 the plugin or the daemon does not answer.
"""


def add(sub: Any) -> None:
    """`hostagent setup`'s parser: `setup authz` (the only thing set up so far)."""
    import argparse

    from gpupin.hostagent.completion import FILES, offer

    setup = sub.add_parser("setup", help="install gpupin into the host's Docker daemon (setup authz)")
    what = setup.add_subparsers(dest="setup", metavar="WHAT", required=True)
    p = what.add_parser(
        "authz",
        help="turn gpupin's authorization plugin on in the daemon (root)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--undo", action="store_true", help="take gpupin out of the daemon's authorization plugins")
    mode.add_argument("--check", action="store_true", help="only report whether the daemon asks gpupin")
    offer(
        p.add_argument(
            "--daemon-json",
            default=DAEMON_JSON,
            metavar="PATH",
            help=f"the daemon's config file (default {DAEMON_JSON})",
        ),
        FILES,
    )
    offer(
        p.add_argument("--pidfile", default=PIDFILE, metavar="PATH", help=f"dockerd's pid file (default {PIDFILE})"),
        FILES,
    )
    offer(
        p.add_argument("--socket", default=SOCKET, metavar="PATH", help=f"the plugin's socket (default {SOCKET})"),
        FILES,
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")


# --- daemon.json ------------------------------------------------------------------------------------------------


def read_config(path: str) -> JSONObject:
    """daemon.json as a dict ({} when there is none); UsageError for a file that is not a JSON object or whose
    plugin list is not a list of names."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise UsageError(
            f"{path}: cannot read it: {err.strerror}", "run it as root (the file is the daemon's)"
        ) from None
    if not raw.strip():
        return {}  # dockerd reads an empty file as no settings
    try:
        data = json.loads(raw)
    except ValueError as err:
        where = f" (line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
        raise UsageError(
            f"{path}: not JSON{where}: the daemon would not start with it either", "fix the file, then run this again"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"{path}: not a JSON object (a {type(data).__name__}): the daemon reads only an object",
            "fix the file, then run this again",
        )
    plugins = data.get(KEY)
    if KEY in data and not (isinstance(plugins, list) and all(isinstance(p, str) for p in plugins)):
        raise UsageError(
            f"{path}: {KEY} is {quoted(plugins)}, not a list of plugin names",
            f'write it as a list, e.g. "{KEY}": ["{PLUGIN}"]',
        )
    return data


def with_plugin(config: JSONObject, on: bool) -> tuple[JSONObject, bool]:
    """The config with gpupin added to (last: every plugin must allow) or removed from its plugin list, every other
    key and plugin kept in place; and whether that changed anything. An emptied list is removed."""
    plugins: list[str] = list(config.get(KEY) or [])
    if on == (PLUGIN in plugins):
        return config, False
    new = dict(config)
    plugins = [*plugins, PLUGIN] if on else [p for p in plugins if p != PLUGIN]
    if plugins:
        new[KEY] = plugins
    else:
        new.pop(KEY, None)
    return new, True


def write_config(path: str, config: JSONObject) -> None:
    """Replace the file at once (a daemon reading it, or a crash, never sees half of it), keeping its mode and owner
    (a new file: 0644, root's, as Docker's packages make it)."""
    try:
        st = os.stat(path)
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        mode, owner = 0o644, None
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.gpupin-{os.getpid()}")
    data = (json.dumps(config, indent=2) + "\n").encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(
            f"{path}: cannot write it: {err.strerror}", "run it as root (the file is the daemon's)"
        ) from None


# --- the plugin and the daemon -----------------------------------------------------------------------------------


def plugin_answers(socket_path: str, timeout: float = 3.0) -> str | None:
    """None when an authz plugin answers Plugin.Activate at `socket_path`, else why not (a few words)."""
    import socket

    from gpupin.hostagent import http1

    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as err:
        return err.strerror or str(err)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
        answer = http1.exchange(
            sock,
            "POST",
            "/Plugin.Activate",
            {},
            host="plugin",
            headers={"Accept": PLUGIN_CONTENT_TYPE, "Connection": "close"},
        )
        status, body = answer.status, answer.body()
    except FileNotFoundError:
        sock.close()
        return "no socket there"
    except ConnectionRefusedError:
        sock.close()
        return "the socket is there but nothing listens"
    except TimeoutError:
        sock.close()
        return f"no answer in {timeout:g} s"
    except OSError as err:  # a ConnectionError too: not an HTTP answer
        sock.close()
        return str(err.strerror or err)
    try:
        implements = json.loads(body).get("Implements") or []
    except (ValueError, AttributeError):
        return f"its Plugin.Activate answer ({status}) is not the plugin protocol's JSON"
    if "authz" not in implements:
        return f"it implements {shown(implements)}, not authz"
    return None


def daemon_pid(pidfile: str) -> int:
    """The running dockerd's pid from its pid file; DockerUnavailableError when there is none."""
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except FileNotFoundError:
        raise DockerUnavailableError(
            f"{pidfile}: no such file: no dockerd to reload",
            "give dockerd's --pidfile (`ps -o args -C dockerd`), or start docker first",
        ) from None
    except (ValueError, ProcessLookupError, OSError):
        raise DockerUnavailableError(
            f"{pidfile}: names no running process", "give dockerd's --pidfile, or start docker first"
        ) from None
    return pid


def flag_conflict(pid: int) -> str | None:
    """The plugin flag on dockerd's command line, if any: a reload refuses a key that both the file and a flag set."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    return next((a for a in args if a.startswith("--authorization-plugin")), None)


def probe(timeout: float = 3.0) -> str:
    """Whether the daemon asks gpupin now: "on", "off", or "down" (the daemon names gpupin but it does not answer);
    DockerUnavailableError when the daemon itself does not answer."""
    from gpupin.hostagent import engine
    from gpupin.hostagent.engine.failures import EngineNotFound

    try:
        engine.fetch(engine.reader(timeout=timeout), f"/containers/{PROBE}/json")
    except EngineNotFound:
        return "off"
    except DockerUnavailableError as err:
        if DENIED_BY in err.message:
            return "on"
        if FAILED in err.message or "timed out" in err.message:
            return "down"
        raise
    return "off"  # someone made a container of that name, and no plugin stopped the inspect


def started_with() -> list[str] | None:
    """The plugins `docker info` lists: those the daemon STARTED with (a reload does not change it); None when the
    daemon does not answer."""
    from gpupin.hostagent import engine

    try:
        info = engine.info(engine.reader(timeout=5))
    except GpupinError:
        return None
    return [str(p) for p in ((info.get("Plugins") or {}).get("Authorization") or [])]


# --- the command ------------------------------------------------------------------------------------------------


class Outcome:
    def __init__(self, args: Any) -> None:
        self.lines: list[str] = []
        self.facts: JSONObject = {"daemon_json": args.daemon_json, "socket": args.socket, "pidfile": args.pidfile}

    def say(self, line: str) -> None:
        self.lines.append(line)

    def emit(self, as_json: bool) -> None:
        if as_json:
            sys.stdout.write(json.dumps(self.facts, indent=2) + "\n")
        else:
            sys.stdout.write("".join(f"setup authz: {line}\n" for line in self.lines))


def _wait_for(want: str, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


STATE_WORDS = {
    "on": "on: the daemon asks gpupin about every request",
    "off": "off: the daemon does not ask gpupin",
    "down": "the daemon asks gpupin, but it does not answer: the daemon refuses every request until it does",
}


def command(args: Any) -> int:
    out = Outcome(args)
    config = read_config(args.daemon_json)
    listed = list(config.get(KEY) or [])
    out.facts["plugins"] = listed
    answer = plugin_answers(args.socket)
    out.facts["plugin_answers"] = answer is None
    if args.check:
        state = probe()
        out.facts.update(state=state, started_with=started_with())
        out.say(f"{args.daemon_json}: {KEY} {json.dumps(listed)}")
        out.say(f"plugin at {args.socket}: " + ("answers" if answer is None else f"no answer ({answer})"))
        out.say(STATE_WORDS[state])
        out.emit(args.json)
        return 0 if state == "on" else EX_NOT_ON
    on = not args.undo
    if on and answer is not None:
        raise DockerUnavailableError(
            f"no gpupin plugin answers at {args.socket} ({answer}): turned on now, the daemon would stop at the "
            "reload, or refuse every request",
            "start the plugin first (`systemctl start gpupin-authz`, or `hostagent authz`), then run this again",
        )
    pid = daemon_pid(args.pidfile)
    flag = flag_conflict(pid)
    if flag:
        raise UsageError(
            f"dockerd (pid {pid}) was started with {quoted(flag)}: a reload refuses {KEY} in daemon.json as well",
            "remove the flag from dockerd's command line (its systemd unit) and restart docker, then run this again",
        )
    new, changed = with_plugin(config, on)
    if changed:
        write_config(args.daemon_json, new)
    out.facts.update(plugins=list(new.get(KEY) or []), changed=changed, pid=pid)
    verb = ("added" if on else "removed") if changed else ("already there" if on else "not there")
    out.say(f"{args.daemon_json}: {KEY} {json.dumps(out.facts['plugins'])} (gpupin {verb})")
    os.kill(pid, signal.SIGHUP)
    out.say(f"dockerd (pid {pid}) told to reload its configuration (SIGHUP)")
    state = _wait_for("on" if on else "off")
    out.facts["state"] = state
    out.say(STATE_WORDS[state])
    out.emit(args.json)
    if state != ("on" if on else "off"):
        raise GpupinError(
            f"the daemon did not take the change: gpupin is {state}",
            "see the daemon's log (`journalctl -u docker`): a reload it refused says why",
        )
    return 0
