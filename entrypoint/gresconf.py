"""Slurm's gres.conf as slurmd reads it: which device file each GPU number in SLURM_STEP_GPUS / SLURM_JOB_GPUS is.

Slurm numbers a node's GPUs by their position in its list of gpu device files, not by minor number. This
module rebuilds that list as Slurm 22.05 does (record order, types, host lists, `AutoDetect=nvml`), each rule
checked against the real slurmd: docs/slurm.md, "How slurmd numbers the gpu device files". Imported only
inside a Slurm job.
"""

from __future__ import annotations

import os
import re
import stat

from gpupin.entrypoint.slurmconf import (
    DEFAULT_SLURM_CONF,
    GPU,
    GresConfError,
    conf_path,
    expand,
    logical_lines,
    names_node,
    node_gpu_types,
    node_name,
    pairs,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

NVIDIA_MAJOR = 195  # /dev/nvidiaN are character devices 195:N (N < 254; nvidiactl is 195:255)
_NVIDIA_N = re.compile(r"nvidia([0-9]+)")


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
            if not names_node(value, node):
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
        raise GresConfError(
            f"the gpu records have several Type=s, whose order slurm.conf gives, and "
            f"{slurm_conf} cannot be read ({err.strerror})"
        ) from None
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
