"""Who is on the other end of a TCP connection from this host: the uid that owns the client's socket, as the kernel
says (sock_diag, what `ss -e` reads), taken when the connection is accepted. On loopback the source address says
nothing about who connects: every local account may connect from any of 127.0.0.1 to 127.255.255.254, so the
agent's HTTP caps are keyed by this uid (gpupin.hostagent.serve.api.caller_key; docs/serve.md, "Limits").
"""

from __future__ import annotations

import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
TCP_TIME_WAIT = 6
_NO_COOKIE = 0xFFFFFFFF
_MSG = 16  # struct nlmsghdr
_UID = 64  # idiag_uid in struct inet_diag_msg (idiag_inode follows)


def _address(family: int, host: str) -> bytes:
    packed = socket.inet_pton(family, host)
    return packed + bytes(16 - len(packed))


def local_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid of the socket at `remote` connected to our `local`, when it is one of this host's (in the agent's
    network namespace) and a process holds it; None otherwise (a remote client, a socket its process has closed:
    the kernel then names root, which it is not), or where the kernel does not say."""
    lhost, lport = str(local[0]), int(local[1])
    rhost, rport = str(remote[0]), int(remote[1])
    family = socket.AF_INET6 if ":" in rhost else socket.AF_INET
    if rhost.startswith("::ffff:") and "." in rhost:  # IPv4 on a dual-stack listener: the client's is IPv4
        family, rhost, lhost = socket.AF_INET, rhost[7:], lhost.removeprefix("::ffff:")
    try:
        sockid = (
            struct.pack("!HH", rport, lport)
            + _address(family, rhost)
            + _address(family, lhost)
            + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
        )
        req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(struct.pack("=IHHII", _MSG + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req, (0, 0))
            data = nl.recv(4096)
    except (OSError, ValueError, struct.error):
        return None
    if len(data) < _MSG + _UID + 8 or struct.unpack_from("=H", data, 4)[0] == NLMSG_ERROR:
        return None
    state = data[_MSG + 1]
    uid, inode = struct.unpack_from("=II", data, _MSG + _UID)
    if state == TCP_TIME_WAIT or inode == 0:
        return None
    return int(uid)
