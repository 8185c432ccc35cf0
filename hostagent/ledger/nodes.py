"""GPU device nodes: which host paths reach one, read by name (any daemon) and, for a daemon on this host, through
its symlinks and the nodes' own device numbers. `hostagent run` refuses a `--device`, `-v` or `--mount` that
reaches one; the ledger counts the cards that a container's devices and mounts reach. Which majors, and how far a
folder is walked: docs/design.md, "Device nodes".
"""

from __future__ import annotations

import os
import posixpath
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

NVIDIA_MAJOR = 195
FIRST_NON_CARD_MINOR = 254  # nvidia-modeset (254) and nvidiactl (255) name no card
DEV = "/dev"
WALK_LIMIT = 100_000  # entries walked under one --device folder before it counts as reaching every node


def normalised(path: str) -> str:
    """The path as the kernel reads it, without touching the file system: `//`, `.` and `..` folded, `/dev/` ->
    `/dev` (`..` is folded by text: a symlink on the way is the resolver's business)."""
    out = posixpath.normpath(path) if path else path
    return "/" + out.lstrip("/") if out.startswith("//") else out


def gpu_majors(proc_devices: str = "/proc/devices") -> frozenset[int]:
    """195 and every character major /proc/devices names nvidia* (the dynamic nvidia-uvm, nvidia-caps, ...)."""
    majors = {NVIDIA_MAJOR}
    try:
        with open(proc_devices, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return frozenset(majors)
    for line in text.partition("Block devices:")[0].splitlines():
        number, _, name = line.strip().partition(" ")
        if number.isdigit() and name.strip().startswith("nvidia"):
            majors.add(int(number))
    return frozenset(majors)


_MAJORS: frozenset[int] | None = None


def majors() -> frozenset[int]:
    """gpu_majors() of this host, read once."""
    global _MAJORS
    if _MAJORS is None:
        _MAJORS = gpu_majors()
    return _MAJORS


def card_minor(major: int, minor: int) -> int | None:
    """The card's minor number when this node names a card (/dev/nvidiaN), else None."""
    return minor if major == NVIDIA_MAJOR and minor < FIRST_NON_CARD_MINOR else None


def _named_minor(path: str) -> int | None:
    """N for /dev/nvidiaN and /dev/char/195:N (and a node named nvidiaN anywhere: docker's own naming)."""
    base = posixpath.basename(path)
    if base.startswith("nvidia") and base[6:].isdigit():
        return int(base[6:])
    if posixpath.dirname(path) == "/dev/char":
        major, colon, minor = base.partition(":")
        if colon and major == str(NVIDIA_MAJOR) and minor.isdigit():
            return int(minor)
    return None


def names_gpu_node(path: str) -> bool:
    """Whether the normalised path reaches a GPU node by its name alone (the rule for a daemon on another host,
    and a floor for one on this host, whose /dev may hold no node yet)."""
    p = normalised(path)
    if p == DEV or DEV.startswith(p.rstrip("/") + "/") or p == "/":
        return True
    if not p.startswith(DEV + "/"):
        return False
    rest = p[len(DEV) + 1 :]
    if rest.startswith("nvidia"):
        return True  # nvidiaN, nvidiactl, nvidia-uvm*, nvidia-modeset, nvidia-caps*/..., nvidia-nvswitch*
    if rest == "char":
        return True
    if rest.startswith("char/"):
        major = rest[5:].partition(":")[0]
        return major.isdigit() and int(major) in majors()
    return False


def named_minors(path: str) -> list[int] | None:
    """The card minors a path names by its name: [N] for one card's node, None for a folder that holds them all
    (/dev and its ancestors, /dev/char), [] for a node that names no card or a path that names none."""
    p = normalised(path)
    if p == DEV or DEV.startswith(p.rstrip("/") + "/") or p in ("/", "/dev/char"):
        return None
    minor = _named_minor(p)
    return [minor] if minor is not None else []


Node = tuple[str, int, int]  # (path, major, minor)


def _node(path: str) -> Node | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors():
        return path, os.major(st.st_rdev), os.minor(st.st_rdev)
    return None


def _children(folder: str) -> Iterator[Node]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        node = _node(e.path)
        if node is not None:
            yield node


def dev_nodes(dev: str = DEV) -> list[Node]:
    """/dev's own GPU nodes, one level of folders deep (/dev/nvidia*, /dev/nvidia-caps/*, /dev/char/*)."""
    out = list(_children(dev))
    for sub in ("nvidia-caps", "nvidia-caps-imex-channels"):
        out += _children(posixpath.join(dev, sub))
    return out


class TreeTooLarge(Exception):
    """A --device folder's tree too big to walk: it counts as reaching every node."""


def _walk(folder: str) -> list[Node]:
    """Every GPU node in the tree (symlinks not followed, as docker's walk); TreeTooLarge past WALK_LIMIT entries; the
    OSError of a folder this user cannot read (the daemon, as root, would walk it: unknown is not "none")."""
    out: list[Node] = []
    seen = 0

    def unreadable(err: OSError) -> None:
        raise err

    for top, dirs, files in os.walk(folder, onerror=unreadable):
        for name in (*files, *dirs):
            seen += 1
            node = _node(os.path.join(top, name))
            if node is not None:
                out.append(node)
        if seen > WALK_LIMIT:
            raise TreeTooLarge(folder)
    return out


def resolved(path: str) -> str | None:
    """The path with every symlink on it resolved, or None where it is not here (a bind's missing folder, which
    the daemon makes). OSError where this user may not look (a folder on the way it may not search, a link loop):
    os.path.realpath would stop there and give a path that hides the rest, which the daemon, as root, follows."""
    try:
        return os.path.realpath(path, strict=True)
    except (FileNotFoundError, NotADirectoryError):
        return None


def local_nodes(path: str, deep: bool) -> list[Node] | None:
    """The GPU nodes a path on this host reaches, symlinks resolved: the node; a folder's tree (`deep`, a
    `--device` folder) or its own entries and, for /dev or a folder that holds it, /dev's nodes (a bind mount).
    None when the path is not here; OSError where this user may not look; TreeTooLarge for a tree too big to
    walk."""
    real = resolved(path)
    if real is None:
        return None
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        node = _node(real)
        return [node] if node is not None else []
    if deep:
        return _walk(real)
    out = list(_children(real))
    if real == DEV or real == "/" or DEV.startswith(real + "/"):
        out += dev_nodes()
    return out


def reaches_gpu_node(path: str, local: bool, deep: bool) -> bool:
    """Whether a host path reaches a GPU node: by its normalised name always; on a daemon of this host also
    through its symlinks and the device numbers of what is there. OSError when this user cannot read the path
    (a link it may not follow, a folder it may not search or list) and TreeTooLarge for a tree too big to walk:
    the caller refuses what it cannot judge."""
    if names_gpu_node(path):
        return True
    if not local:
        return False
    if names_gpu_node(os.path.realpath(path)):
        return True
    return bool(local_nodes(path, deep))
