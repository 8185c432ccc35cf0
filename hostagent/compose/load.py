"""Reading a compose file: bytes, then text, then YAML (hostagent.yamlfile, whose refusal becomes the file's
ServiceError), then a plain tree; every limit is here or there, once (size, encoding, depth, alias expansion,
duplicate keys, tags: docs/compose.md, "Bad input")."""

from __future__ import annotations

import os
import re

from gpupin.core import files
from gpupin.hostagent import yamlfile
from gpupin.hostagent.compose.problems import ServiceError
from gpupin.hostagent.yamlfile import MAX_DEPTH, MAX_EXPANDED, RESET, Override, yaml_module

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_EXPANDED", "RESET", "Override", "decode", "dump", "load", "parse", "read"]

MAX_BYTES = 1 << 20


def _refuse(message: str, hint: str) -> ServiceError:
    return ServiceError(None, message, hint)


def parse(text: str) -> Any:
    """The YAML document as a tree, or ServiceError(None, ...) that says where and why."""
    try:
        return yamlfile.parse(text)
    except yamlfile.YamlRefused as err:
        raise _refuse(err.message, err.hint or "") from None


def decode(data: bytes) -> str:
    """UTF-8 text (a BOM dropped), or ServiceError(None, ...) naming the first byte that is not."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _refuse("it is UTF-16 text, not UTF-8", "save it as UTF-8, the encoding compose files use")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise _refuse(
            f"it is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}, column {column})",
            "save it as UTF-8, the encoding compose files use",
        ) from None


def read(path: str) -> bytes:
    """At most MAX_BYTES of the file, or ServiceError(None, ...): a FIFO, a device or /dev/zero is refused at once,
    never waited on (gpupin.core.files.read_bounded)."""
    if os.path.isdir(path):
        raise _refuse("it is a directory, not a compose file", "give the compose file itself (e.g. DIR/compose.yaml)")
    try:
        return files.read_bounded(path, MAX_BYTES)
    except files.FileRefused as err:
        if err.reason.startswith("it is larger than"):
            raise _refuse(
                f"it is larger than {MAX_BYTES >> 10} KiB, far beyond any compose file",
                "check that it is the compose file",
            ) from None
        raise _refuse(err.reason, err.hint or "give the path of a readable compose file") from None


def load(path: str) -> Any:
    """The compose file at `path` as a tree (bytes, text and YAML, with the limits above)."""
    return parse(decode(read(path)))


def larger_than(tree: Any, limit: int) -> bool:
    """Whether a tree (aliases already copies) weighs more than `limit` nodes and scalar characters, as _weigh
    counts them; the walk stops at the limit, so a tree of gigabytes costs no more than one of `limit`."""
    size = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        size += 1 + (len(node) if isinstance(node, str) else 0)
        if size > limit:
            return True
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def dump(doc: Any) -> str:
    """The tree as YAML both compose versions read alike: text that either YAML 1.1 (docker-compose 1.x) or YAML
    1.2 (compose v2) would read as something else is quoted (`yes`, `1e3`, `22:22`); keys keep their order."""
    yaml = yaml_module()

    class Dumper(yaml.SafeDumper):  # type: ignore[name-defined,misc]
        pass

    Dumper.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
    )
    text: str = yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)
    return text
