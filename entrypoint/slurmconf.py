"""Slurm's own config files as slurmd 22.05 reads them: where they are (beside SLURM_CONF's slurm.conf), their
syntax (comments, continuations, quoting, `Include`), host lists (`/dev/nvidia[7,3]`, expanded in the order
written), and slurm.conf's `Gres=` of a node. gpupin.entrypoint.gresconf reads gres.conf through it
(docs/slurm.md, "How slurmd numbers the gpu device files").
"""

from __future__ import annotations

import errno
import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"  # Debian's and upstream's compiled-in default
GPU = "gpu"
# A key=value pair as parse_config.c's keyvalue_pattern reads it (an operator before '=' is allowed, unused here).
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s+(\S+)", re.IGNORECASE)
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_MAX_INCLUDE_DEPTH = 16
MAX_FILES = 64  # files read for one config, Includes counted (a real slurm.conf includes a handful)
MAX_BYTES = 1 << 20  # per file: a real gres.conf or slurm.conf is a few KiB
MAX_NAMES = 1 << 17  # names of one host list, ranges multiplied out (`nvidia[0-65536]x[0-65536]`)


class GresConfError(Exception):
    """gres.conf (or slurm.conf) could not be read as slurmd reads it; the message says why, for the report."""


def conf_path(env: Mapping[str, str], name: str) -> str:
    """Where Slurm looks for `name` beside slurm.conf (get_extra_conf_path)."""
    slurm_conf = env.get("SLURM_CONF") or DEFAULT_SLURM_CONF
    head, slash, _ = slurm_conf.rpartition("/")
    return f"{head}{slash}{name}"


def node_name(env: Mapping[str, str]) -> str:
    """slurmd's name for this node: Slurm writes it into each task's environment; else the host's short name."""
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


# --- Slurm's config syntax (src/common/parse_config.c) ---


def _strip_comment(line: str) -> str:
    backslashes = 0
    for i, ch in enumerate(line):
        if ch == "#" and backslashes % 2 == 0:
            return line[:i]
        backslashes = backslashes + 1 if ch == "\\" else 0
    return line


def _continued(line: str) -> str | None:
    """The line less its continuation backslash when it ends in an odd number of them (then spaces), else None."""
    body = line.rstrip()
    count = len(body) - len(body.rstrip("\\"))
    return body[:-1] if count % 2 == 1 else None


def _unescape(line: str) -> str:
    return re.sub(r"\\(.?)", r"\1", line)


def _read(path: str) -> str:
    """A config file's text: a regular file of at most MAX_BYTES (a FIFO or /dev/zero is refused at once, never
    waited on: gpupin.core.files); OSError for any file that is not read, saying why."""
    from gpupin.core import files  # inside a Slurm job only: the entrypoint's start-up imports nothing more

    try:
        return files.read_text(path, MAX_BYTES)
    except files.FileRefused as err:
        strerror = os.strerror(err.errno) if err.errno is not None else err.reason
        raise OSError(err.errno or errno.EINVAL, strerror, path) from None


def logical_lines(path: str, _depth: int = 0, _budget: list[int] | None = None) -> Iterator[str]:
    """The lines of a Slurm config file as its parser sees them: comments gone, continuations joined, escapes
    resolved, `Include FILE` (relative to this file's directory) read in place. OSError when a file cannot be
    read; GresConfError for an include too deep or one that names the cluster (%c), or past MAX_FILES files
    read in all (`Include`s of `Include`s fan out: two a level, 16 levels deep, are 65,536 reads)."""
    budget = [MAX_FILES] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0:
        raise GresConfError(f"more than {MAX_FILES} files through `Include`")
    physical = _read(path).splitlines()
    pending = ""
    for raw in physical:
        text = _strip_comment(raw)
        cut = _continued(text)
        if cut is not None:
            pending += cut
            continue
        line = _unescape(pending + text).strip()
        pending = ""
        include = _INCLUDE.fullmatch(line)
        if include:
            name = include.group(1)
            if "%c" in name or _depth >= _MAX_INCLUDE_DEPTH:
                raise GresConfError(f"`Include {name}` is not followed (a cluster name, or too deep)")
            yield from logical_lines(os.path.join(os.path.dirname(path), name), _depth + 1, budget)
        elif line:
            yield line
    if pending:
        yield _unescape(pending).strip()


def pairs(line: str) -> list[tuple[str, str]]:
    """The key=value pairs of one logical line, keys lower-cased; GresConfError when something else is left."""
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        m = _PAIR.match(line, pos)
        if not m:
            break
        out.append((m.group(1).lower(), m.group(2) if m.group(2) is not None else m.group(3)))
        pos = m.end()
    if line[pos:].strip():
        raise GresConfError(f"cannot read {line[pos:].strip()[:40]!r} (in {line[:60]!r})")
    return out


# --- Slurm's host lists (src/common/hostlist.c): node names and device files alike ---


def _tokens(text: str) -> list[str]:
    """Split at commas and blanks outside brackets."""
    tokens: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch in ", \t" and depth == 0:
            if current:
                tokens.append(current)
            current = ""
            continue
        depth += 1 if ch == "[" else -1 if ch == "]" and depth else 0
        current += ch
    if current:
        tokens.append(current)
    return tokens


def _numbers(ranges: str, whole: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        m = _RANGE.fullmatch(part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise GresConfError(f"bad range {part!r} in {whole!r}")
        lo = m.group(1)
        hi = int(m.group(2)) if m.group(2) is not None else int(lo)
        if hi - int(lo) > 65536:
            raise GresConfError(f"range {part!r} in {whole!r} is too long")
        out.extend(f"{n:0{len(lo)}d}" for n in range(int(lo), hi + 1))
    return out


def _expand_token(token: str, whole: str) -> list[str]:
    if "[" not in token:
        return [token]
    head, _, tail = token.rpartition("[")
    if not tail.endswith("]") or "]" in tail[:-1]:
        raise GresConfError(f"bad brackets in {whole!r}")
    numbers = _numbers(tail[:-1], whole)
    # The prefix may hold one more range (rack[1-2]_gpu[0-3]); its names come first, as hostlist.c pushes them.
    if "[" in head:
        open_at = head.rfind("[")
        close_at = head.find("]", open_at)
        if close_at < 0:
            raise GresConfError(f"bad brackets in {whole!r}")
        outer = _expand_token(head[: close_at + 1], whole)
        rest = head[close_at + 1 :]
        if len(outer) * len(numbers) > MAX_NAMES:
            raise GresConfError(f"{whole!r} names more than {MAX_NAMES} files or hosts")
        return [f"{p}{rest}{n}" for p in outer for n in numbers]
    return [f"{head}{n}" for n in numbers]


def expand(hostlist: str) -> list[str]:
    """Every name of a Slurm host list, in the order written: `nvidia[7,3]` is nvidia7, nvidia3; `n[08-10]` keeps
    the width of the lower bound (n08, n09, n10)."""
    names: list[str] = []
    for token in _tokens(hostlist):
        names.extend(_expand_token(token, hostlist))
        if len(names) > MAX_NAMES:
            raise GresConfError(f"{hostlist!r} names more than {MAX_NAMES} files or hosts")
    return names


def names_node(hostlist: str, node: str) -> bool:
    """Whether a NodeName= host list names this node; one Slurm cannot parse names none (hostlist_find)."""
    try:
        return node in expand(hostlist)
    except GresConfError:
        return False


# --- slurm.conf: the node's Gres= (only needed to order several gpu types) ---


def node_gpu_types(slurm_conf: str, node: str) -> list[tuple[str | None, int]]:
    """(type, count) of the node's gpu gres in slurm.conf's `Gres=` order ([(None, n)] when untyped), as
    gres.c _get_gres_cnt reads it. GresConfError when slurm.conf has no line for the node or no gpu in it."""
    default: str | None = None
    gres: str | None = None
    found = False
    for line in logical_lines(slurm_conf):
        if line[:8].lower() != "nodename":  # only NodeName lines matter; the rest is not parsed
            continue
        items = pairs(line)
        if not items or items[0][0] != "nodename":
            continue
        values = dict(items[1:])
        if items[0][1].lower() == "default":
            default = values.get("gres", default)
        elif names_node(items[0][1], node):
            gres = values.get("gres", default)
            found = True
            break
    if not found:
        raise GresConfError(f"{slurm_conf} has no NodeName line for {node}")
    types: list[tuple[str | None, int]] = []
    for token in (gres or "").split(","):
        if token == GPU:
            return [(None, 1)]
        if not token.startswith(GPU + ":"):
            continue
        token = token.split("(")[0]
        parts = token.split(":")[1:]
        count = int(parts.pop()) if parts and parts[-1].isdigit() else 1
        for t in parts:
            if t.lower() == "no_consume":
                continue
            known = next((i for i, (name, _) in enumerate(types) if name == t), None)
            if known is None:
                types.append((t, count))
            else:
                types[known] = (t, types[known][1] + count)
        if not parts:
            types.append((None, count))
    if not types:
        raise GresConfError(f"{slurm_conf} gives {node} no gpu gres (Gres={gres})")
    return types
