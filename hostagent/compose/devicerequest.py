"""A device request (a `deploy.resources.reservations.devices` entry, or a `gpus:` entry) as compose-go reads it:
its JSON schema, its transform, then the decoding of `count`, in that order (measured on compose v2.26), so that
`check` refuses what `docker compose` would refuse, with compose's own words beside gpupin's (docs/compose.md,
"A device request as compose reads it").
"""

from __future__ import annotations

import re

from gpupin.hostagent.compose.problems import ServiceError, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

EVERY = -1  # compose-go's count of every device: `all`, `-1`, and an entry with neither count nor device_ids
_KEYS = ("capabilities", "count", "device_ids", "driver", "options")
_INTEGER = re.compile(r"[+-]?[0-9]+")  # Go's strconv.ParseInt(s, 10, 64)
_ENTRY = "{driver: nvidia, device_ids: [UUID, ...] | count: N, capabilities: [gpu]}"


def _refused(service: str, what: str, says: str, hint: str) -> ServiceError:
    return ServiceError(service, f"{what}: compose refuses it ({says})", hint)


def _strings(entry: Mapping[str, Any], key: str, service: str, at: str) -> None:
    """compose-spec's list_of_strings: a list of strings, each once."""
    value = entry[key]
    if not isinstance(value, list):
        raise _refused(
            service,
            f"`{key}: {quoted(value, 40)}` is not a list",
            f"{at}.{key} must be a list",
            f"write it as a list: {key}: [...]",
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _refused(
                service,
                f"{key} entry {quoted(item)} is not text",
                f"{at}.{key}.{i} must be a string",
                f"quote it: '{item}'",
            )
        if item in value[:i]:
            raise _refused(
                service,
                f"{key} lists {quoted(item)} twice",
                f"{at}.{key} array items[{value.index(item)},{i}] must be unique",
                "list each once",
            )


def count(value: Any, service: str, at: str) -> int:
    """A `count` as compose-go decodes it: the number, or EVERY for `all`; ServiceError with compose's words."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _refused(
            service,
            f"count: {quoted(value)} is not a number of cards",
            f"{at}.count must be a string or integer",
            "give a whole number, or `all`",
        )
    if isinstance(value, str):
        if value.lower() == "all":
            return EVERY
        if not _INTEGER.fullmatch(value):
            raise _refused(
                service,
                f"count: {quoted(value)} is not a number of cards",
                f"invalid value \"{value}\", the only value allowed is 'all' or a number",
                "give a whole number, or `all`",
            )
    number = int(value)
    if number == 0 or number < EVERY:
        raise ServiceError(
            service,
            f"count: {number} asks for no card (Docker hands out none)",
            "give a number of cards >= 1, or `all`",
        )
    return number


def schema(entry: Mapping[str, Any], service: str, at: str, needs_capabilities: bool) -> int | None:
    """compose-go's checks of one device request at `at` (its path, as compose names it): the count it asks
    (EVERY for every device), or None when it names device_ids; ServiceError with compose's words otherwise."""
    unknown = [k for k in entry if k not in _KEYS and not str(k).startswith("x-")]
    if unknown:
        raise _refused(
            service,
            f"a device request has the key {quoted(unknown[0])}",
            f"{at} Additional property {unknown[0]} is not allowed",
            f"a device request is {_ENTRY} (and options:)",
        )
    if needs_capabilities and "capabilities" not in entry:
        raise _refused(
            service,
            "a device request has no `capabilities`",
            f"{at} capabilities is required",
            "add capabilities: [gpu] (the NVIDIA driver serves the `gpu` capability)",
        )
    for key in ("capabilities", "device_ids"):
        if key in entry:
            _strings(entry, key, service, at)
    if "driver" in entry and not isinstance(entry["driver"], str):
        raise _refused(
            service,
            f"driver: {quoted(entry['driver'])} is not text",
            f"{at}.driver must be a string",
            "write driver: nvidia (or cdi)",
        )
    if "count" in entry and "device_ids" in entry:
        raise _refused(
            service,
            "a device request has both `count` and `device_ids`",
            f'{at}: "count" and "device_ids" attributes are exclusive',
            "keep device_ids (by UUID), or better, use x-gpupin and render",
        )
    if "device_ids" in entry:
        return None
    return count(entry["count"], service, at) if "count" in entry else EVERY
