"""Where the agent listens: its unix socket (mode 0660, owned by root and the agent's group, as the Docker socket
is) and its TCP address (loopback unless the public choice is made: docs/serve.md, "Who can reach it")."""

from __future__ import annotations

import os
import re
import socket

from gpupin.core.errors import AgentBusyError, UsageError
from gpupin.hostagent.agentlink import DEFAULT_SOCKET as DEFAULT_SOCKET

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.hostagent.serve.api import Handler, TcpServer, UnixServer

DEFAULT_GROUP = "gpupin"
DEFAULT_HTTP = "127.0.0.1:9417"
SOCKET_MODE = 0o660


def http_address(text: str, public: bool) -> tuple[str, int] | None:
    """`HOST:PORT`, `:PORT` (loopback), `[V6]:PORT` or `none` -> (host, port); a non-loopback host needs `public`."""
    if text.lower() in ("none", "off", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--http {text!r}: expected HOST:PORT (127.0.0.1:9417, [::1]:9417, :9417) or none",
            f"hostagent serve --http {DEFAULT_HTTP}",
        )
    host = host.strip("[]") or "127.0.0.1"
    loopback = host == "localhost"
    if not loopback:
        import ipaddress

        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            raise UsageError(
                f"--http {text!r}: {host!r} is not an IP address",
                "give the address to listen on (0.0.0.0 for every interface, with --http-public)",
            ) from None
    if not loopback and not public:
        raise UsageError(
            f"--http {text} listens beyond this host: anyone who reaches it reads the cards, the "
            "containers that hold them, their images and users, and the host's name",
            'add --http-public to mean it (docs/serve.md, "Who can reach it"), or keep the default loopback address',
        )
    return host, int(port)


def group_id(name: str | None) -> int | None:
    """The socket's group: `name`, or the default group where it exists (None: root's only, mode 0660 still)."""
    import grp

    try:
        return grp.getgrnam(name or DEFAULT_GROUP).gr_gid
    except KeyError:
        if name is None:
            return None
        raise UsageError(
            f"--group {name}: no such group on this host",
            f"create it (groupadd {name}) and add the users who may use the agent",
        ) from None


def _live(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def unix_server(path: str, gid: int | None, handler: type[Handler]) -> UnixServer:
    """Bind the socket with no moment of wider access (umask), then give it its group and mode."""
    from gpupin.hostagent.serve.api import UnixServer

    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    if os.path.exists(path) or os.path.islink(path):
        if _live(path):
            raise AgentBusyError(
                f"an agent already listens on {path}",
                "stop it first (systemctl stop gpupin-hostagent), or give this one another --socket",
            )
        if os.path.islink(path) or not _is_socket(path):
            raise UsageError(
                f"--socket {path}: something that is not a socket is there", "remove it, or give another --socket"
            )
        os.unlink(path)  # a socket left by an agent that died: nothing listens on it
    old = os.umask(0o177)
    try:
        server = UnixServer(path, handler)
    except OSError as err:
        raise UsageError(f"--socket {path}: cannot listen there ({err.strerror})", "give another --socket") from None
    finally:
        os.umask(old)
    try:
        if gid is not None:
            os.chown(path, 0 if os.geteuid() == 0 else -1, gid)
        os.chmod(path, SOCKET_MODE)
    except OSError as err:
        server.server_close()
        os.unlink(path)
        raise UsageError(
            f"--socket {path}: cannot give it its group ({err.strerror})",
            "run the agent as root, or as a member of --group",
        ) from None
    return server


def _is_socket(path: str) -> bool:
    import stat

    return stat.S_ISSOCK(os.lstat(path).st_mode)


def host_names(given: list[str]) -> frozenset[str]:
    """The names the TCP listener answers to (Host): the loopback names and `--http-host`'s, each a bare DNS name
    (any port is taken; an IP address is always taken: docs/serve.md, "Who can reach it")."""
    from gpupin.hostagent.serve.api import LOOPBACK_NAMES

    for name in given:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9.])?", name):
            raise UsageError(
                f"--http-host {name!r}: expected a host name (letters, digits, dots and dashes), without a port",
                "hostagent serve --http 0.0.0.0:9417 --http-public --http-host gpu1.example.org",
            )
    return LOOPBACK_NAMES | {n.lower() for n in given}


def tcp_server(address: tuple[str, int], handler: type[Handler], names: frozenset[str] | None = None) -> TcpServer:
    from gpupin.hostagent.serve.api import TcpServer

    host, port = address
    attrs: dict[str, object] = {} if names is None else {"host_names": names}
    if ":" in host:
        attrs["address_family"] = socket.AF_INET6
    server: type[TcpServer] = type("AgentTcpServer", (TcpServer,), attrs) if attrs else TcpServer
    try:
        return server((host, port), handler)
    except OSError as err:
        raise UsageError(
            f"--http {host}:{port}: cannot listen there ({err.strerror})", "give another --http address, or none"
        ) from None
