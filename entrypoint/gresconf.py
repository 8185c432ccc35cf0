"""Slurm's gres.conf as slurmd reads it: which device file each GPU number in SLURM_STEP_GPUS / SLURM_JOB_GPUS is.

Slurm numbers a node's GPUs by their position in its list of gpu device files (`gres_device->index`), not by
minor number: with gres.conf listing nvidia7, nvidia3, nvidia5, nvidia1, `srun --gres=gpu:2` gets nvidia7 and
nvidia3 as SLURM_STEP_GPUS=0,1. This module rebuilds that list the way Slurm 22.05 does (read in its source,
slurm-wlm 22.05.8; each rule checked against the real slurmd by tests/cluster/test_slurm.py, which compares with the
list slurmd logs under DebugFlags=Gres):

- gres.conf is the file of that name beside slurm.conf: in the directory of SLURM_CONF (which slurmd puts into
  every task's environment), else of the compiled-in /etc/slurm/slurm.conf (src/common/read_config.c,
  get_extra_conf_path).
- The syntax is Slurm's config syntax (src/common/parse_config.c): `#` starts a comment, a line ending in `\\`
  continues on the next, `\\x` is x, keys are case-insensitive, a value is one word or "quoted", `Include FILE`
  reads another file. A line starts with `Name=`, `NodeName=` or `AutoDetect=`.
- Records with `NodeName=` count only where the host list names this node (slurmd's NodeName: SLURMD_NODENAME in a
  task, else the host's short name); Slurm takes every `Name=` record first, in file order, then the matching
  `NodeName=` records, in file order (src/common/gres.c, gres_g_node_config_load).
- When the gpu records carry two or more `Type=`s, they are regrouped by the type order of the node's `Gres=` in
  slurm.conf, file order within a type, each type cut at its count (gres.c, _merge_config); one type (or none)
  keeps file order.
- Each `File=` (or `Files=`) is a host list, expanded in the order written: `/dev/nvidia[7,3]` is nvidia7, then
  nvidia3 (src/common/hostlist.c); each file is one GPU. A `MultipleFiles=` record is one GPU with several files.
  Only records named exactly `gpu` make devices (src/plugins/gres/common/gres_common.c, common_node_config_load),
  and an existing path that is not a device file is skipped without a number.
- `AutoDetect=nvml` (node-local wins over global, `off` turns it off) changes the order when slurmd was built with
  NVML: the detected GPUs are sorted by their NVLink matrix, "a stand-in for PCI bus ID order", i.e. by NVML index
  (src/plugins/gres/gpu/gres_gpu.c, _merge_system_gres_conf; src/plugins/gpu/nvml/gpu_nvml.c puts -1 at the
  card's own NVML index), listed files that NVML did not detect after them. Debian's slurm-wlm is built without
  NVML, and then the File= order stands. Which applies cannot be seen from a task: gpupin.entrypoint.slurm checks
  both.

Costs a few small file reads (and slurm.conf only when the gpu records have several types); imported only inside a
Slurm job.
"""

from __future__ import annotations

import os
import re
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"  # Debian's and upstream's compiled-in default
NVIDIA_MAJOR = 195  # /dev/nvidiaN are character devices 195:N (N < 254; nvidiactl is 195:255)
GPU = "gpu"
# A key=value pair as parse_config.c's keyvalue_pattern reads it (an operator before '=' is allowed, unused here).
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s+(\S+)", re.IGNORECASE)
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_NVIDIA_N = re.compile(r"nvidia([0-9]+)")
_MAX_INCLUDE_DEPTH = 16


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


def logical_lines(path: str, _depth: int = 0) -> Iterator[str]:
    """The lines of a Slurm config file as its parser sees them: comments gone, continuations joined, escapes
    resolved, `Include FILE` (relative to this file's directory) read in place. OSError when a file cannot be
    read; GresConfError for an include too deep or one that names the cluster (%c)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        physical = f.read().splitlines()
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
            yield from logical_lines(os.path.join(os.path.dirname(path), name), _depth + 1)
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
        outer = _expand_token(head[:close_at + 1], whole)
        rest = head[close_at + 1:]
        return [f"{p}{rest}{n}" for p in outer for n in numbers]
    return [f"{head}{n}" for n in numbers]


def expand(hostlist: str) -> list[str]:
    """Every name of a Slurm host list, in the order written: `nvidia[7,3]` is nvidia7, nvidia3; `n[08-10]` keeps
    the width of the lower bound (n08, n09, n10)."""
    names: list[str] = []
    for token in _tokens(hostlist):
        names.extend(_expand_token(token, hostlist))
    return names


def _names(hostlist: str, node: str) -> bool:
    """Whether a NodeName= host list names this node; one Slurm cannot parse names none (hostlist_find)."""
    try:
        return node in expand(hostlist)
    except GresConfError:
        return False


# --- gres.conf ---

class GresRecord:
    """One gres.conf record that applies to this node."""

    __slots__ = ("files", "multiple", "name", "type")

    def __init__(self, name: str, gres_type: str | None, files: list[str], multiple: bool) -> None:
        self.name = name
        self.type = gres_type
        self.files = files
        self.multiple = multiple

    def __repr__(self) -> str:
        return f"GresRecord({self.name!r}, type={self.type!r}, files={self.files!r}, multiple={self.multiple})"


def _autodetect(value: str) -> str | None:
    """gres.c _handle_autodetect_flags: nvml / rsmi / oneapi by substring, `off`, anything else unset."""
    low = value.lower()
    for flag in ("nvml", "rsmi", "oneapi"):
        if flag in low:
            return flag
    return "off" if low == "off" else None


def _record(items: list[tuple[str, str]], name: str) -> GresRecord:
    values = dict(items)  # the last value of a key wins, as in Slurm
    file_list = values.get("file", values.get("files"))
    multiple = file_list is None and "multiplefiles" in values
    if multiple:
        file_list = values["multiplefiles"]
    return GresRecord(name, values.get("type"), expand(file_list) if file_list else [], multiple)


class GresConf:
    """The gres.conf records that apply to one node, in slurmd's order, and its AutoDetect setting."""

    __slots__ = ("autodetect", "node", "path", "records")

    def __init__(self, path: str, node: str, records: list[GresRecord], autodetect: str | None) -> None:
        self.path = path
        self.node = node
        self.records = records
        self.autodetect = autodetect  # "nvml", "rsmi", "oneapi" or None (unset or off)

    @property
    def gpu_records(self) -> list[GresRecord]:
        return [r for r in self.records if r.name.lower() == GPU]


def parse_gres_conf(path: str, node: str) -> GresConf:
    """gres.conf as slurmd on `node` reads it (gres.c gres_g_node_config_load, _parse_gres_config[_node]).
    OSError when it cannot be read, GresConfError when it cannot be parsed."""
    by_name: list[GresRecord] = []
    by_node: list[GresRecord] = []
    global_auto: str | None = None
    local_auto: str | None = None
    for line in logical_lines(path):
        items = pairs(line)
        if not items:
            continue
        key, value = items[0]
        rest = items[1:]
        if key == "autodetect":
            global_auto = value
        elif key == "name":
            by_name.append(_record(rest, value))
        elif key == "nodename":
            if not _names(value, node):
                continue
            values = dict(rest)
            if "autodetect" in values:
                local_auto = values["autodetect"]
            if "name" in values:
                by_node.append(_record(rest, values["name"]))
        # any other first key: slurmd refuses the file; a newer Slurm may know it. Not a GPU record either way.
    flag = _autodetect(local_auto) if local_auto is not None else None
    if flag is None and global_auto is not None:
        flag = _autodetect(global_auto)
    return GresConf(path, node, by_name + by_node, None if flag in (None, "off") else flag)


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
        elif _names(items[0][1], node):
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


def slurm_order(conf: GresConf, slurm_conf: str | None) -> list[GresRecord]:
    """The gpu records in the order slurmd merges them with slurm.conf (gres.c _merge_config, _match_type):
    untyped or single-typed, file order; several types, by slurm.conf's type order, each cut at its count.
    `slurm_conf` is read only in the second case (GresConfError when it cannot be)."""
    records = conf.gpu_records
    if len({(r.type or "").lower() for r in records}) <= 1:
        return records
    if slurm_conf is None:
        raise GresConfError("the gpu records have several Type=s, whose order slurm.conf gives")
    try:
        types = node_gpu_types(slurm_conf, conf.node)
    except OSError as err:
        raise GresConfError(f"the gpu records have several Type=s, whose order slurm.conf gives, and "
                            f"{slurm_conf} cannot be read ({err.strerror})") from None
    ordered: list[GresRecord] = []
    left = list(records)
    for gres_type, count in types:
        for record in list(left):
            if count <= 0:
                break
            if gres_type is not None and (record.type or "").lower() != gres_type.lower():
                continue
            left.remove(record)
            size = 1 if record.multiple or not record.files else len(record.files)
            if size > count and not record.multiple:
                record = GresRecord(record.name, record.type, record.files[:count], False)
                size = count
            ordered.append(record)
            count -= size
    return ordered


class Device:
    """One of the node's GPUs in Slurm's numbering: its device file(s)."""

    __slots__ = ("files",)

    def __init__(self, files: tuple[str, ...]) -> None:
        self.files = files


def _is_device(path: str) -> bool:
    """False only for a path that exists and is neither a character nor a block device (slurmd skips those)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True  # not here (a container without it): slurmd saw it, or it would not have started
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def devices(records: list[GresRecord]) -> list[Device]:
    """Slurm's numbering of the node's GPUs: device k is gres_device->index k (common_node_config_load)."""
    out: list[Device] = []
    for record in records:
        if record.name != GPU or not record.files:
            continue
        if record.multiple:
            out.append(Device(tuple(record.files)))
        else:
            out.extend(Device((f,)) for f in record.files if _is_device(f))
    return out


def minor_of(path: str) -> tuple[int | None, str]:
    """The minor number of a gpu device file and how it was found: ("" when stat'ed) the N of /dev/nvidiaN when the
    file is not here (a container given some cards only: slurmd refuses to start when a File= is missing, so on
    the node it exists), or (None, why) when it is not an NVIDIA GPU's device file."""
    try:
        st = os.stat(path)
    except OSError as err:
        m = _NVIDIA_N.fullmatch(os.path.basename(path))
        if m:
            return int(m.group(1)), f"minor number from its name: {(err.strerror or 'error').lower()} here"
        return None, f"{path} is not here ({err.strerror}) and its name gives no minor number"
    if not stat.S_ISCHR(st.st_mode):
        return None, f"{path} is not a character device"
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    if major != NVIDIA_MAJOR or minor >= 254:
        return None, f"{path} is device {major}:{minor}, not an NVIDIA GPU ({NVIDIA_MAJOR}:N)"
    return minor, ""


def read(env: Mapping[str, str]) -> tuple[GresConf, list[Device]]:
    """This node's gres.conf and its GPUs in Slurm's numbering (before any AutoDetect merge); GresConfError (why,
    for the report) when gres.conf cannot be read or ordered."""
    path = conf_path(env, "gres.conf")
    node = node_name(env)
    try:
        conf = parse_gres_conf(path, node)
    except OSError as err:
        raise GresConfError(f"no readable {err.filename or path} here ({err.strerror})") from None
    except GresConfError as err:
        raise GresConfError(f"{path}: {err}") from None
    try:
        records = slurm_order(conf, env.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    except GresConfError as err:
        raise GresConfError(f"{path}: {err}") from None
    return conf, devices(records)
