"""The ledger: who holds which card, read from the running containers themselves (DESIGN.md, "The ledger").

Containers that hostagent starts carry the label `gpupin.devices=UUID[,UUID...]`; those labels are the only record
of a pinned container's cards, so nothing can go stale: a container that is gone holds nothing. Containers
started with GPUs by other means (`--gpus all`, `--gpus 2`, `--gpus device=1`, `--runtime nvidia` with
NVIDIA_VISIBLE_DEVICES) are read from their device requests and count as holders too.

A card is *held* by a container that is running, paused or restarting. A created container that was never
started (a hostagent killed between create and start) holds nothing. "Look, then create" is made atomic across
hostagents on this host by `HostLock`, an flock the kernel releases when its holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

from gpupin.entrypoint.errors import GpupinError
from gpupin.entrypoint.resolve import resolve
from gpupin.hostagent.pin import LABEL as LABEL  # the ledger reads the labels the pin writes
from gpupin.hostagent.pin import SHARED_LABEL as SHARED_LABEL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card

HOLDING_STATES = frozenset({"running", "paused", "restarting"})


class Holder:
    """A container that has (or had) cards: pinned by hostagent, or given GPUs some other way."""

    __slots__ = ("how", "id", "name", "pinned", "shared", "state", "uuids")

    def __init__(self, id: str, name: str, state: str, uuids: Sequence[str], pinned: bool, how: str,
                 shared: bool = False) -> None:
        self.id = id
        self.name = name
        self.state = state
        self.uuids = tuple(uuids)
        self.pinned = pinned
        self.how = how  # "gpupin", "--gpus all", "--gpus 2", "--gpus device=...", "runtime=nvidia"
        self.shared = shared

    @property
    def holds(self) -> bool:
        return self.state in HOLDING_STATES

    def describe(self) -> str:
        return f"{self.name} ({self.id[:12]}, {self.state}{'' if self.pinned else ', ' + self.how})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "state": self.state, "pinned": self.pinned, "how": self.how,
                "shared": self.shared, "holds": self.holds, "uuids": list(self.uuids)}

    def __repr__(self) -> str:
        return f"Holder({self.describe()}: {','.join(self.uuids)})"


def _name(summary: Mapping[str, Any]) -> str:
    names = summary.get("Names") or [summary.get("Name") or ""]
    return str(names[0]).lstrip("/")


def pinned_holder(summary: Mapping[str, Any]) -> Holder | None:
    """A hostagent-started container, from its list summary (`GET /containers/json`): labels say it all."""
    labels = summary.get("Labels") or {}
    value = labels.get(LABEL)
    if not value:
        return None
    uuids = [u.strip() for u in value.split(",") if u.strip()]
    state = str(summary.get("State") or "unknown")
    return Holder(str(summary["Id"]), _name(summary), state, uuids, True, "gpupin",
                  labels.get(SHARED_LABEL, "") == "true")


def _resolve_ids(ids: Iterable[str], cards: Sequence[Card]) -> list[str]:
    """Device ids as Docker hands them to the runtime (indices, UUIDs, MIG forms, bus ids, `all`) -> UUIDs."""
    out: list[str] = []
    for raw in ids:
        spec = raw.strip()
        if spec == "all":
            out.extend(c.uuid for c in cards if c.uuid)
            continue
        try:
            out.append(resolve(spec, cards).uuid)
        except GpupinError:
            continue  # an id this host does not know: the runtime refuses such a container, so it holds nothing
    return list(dict.fromkeys(out))


def foreign_holder(inspect: Mapping[str, Any], cards: Sequence[Card]) -> Holder | None:
    """A container given GPUs outside hostagent, from `docker inspect`: its device requests or runtime=nvidia."""
    host = inspect.get("HostConfig") or {}
    uuids: list[str] = []
    how = ""
    for req in host.get("DeviceRequests") or []:
        caps = {c for group in (req.get("Capabilities") or []) for c in group}
        # `docker run --gpus` sends Driver "" with the "gpu" capability; the SDK's requests name "nvidia".
        if not (req.get("Driver") == "nvidia" or (not req.get("Driver") and "gpu" in caps)):
            continue
        count = int(req.get("Count") or 0)
        ids = req.get("DeviceIDs") or []
        if ids:
            uuids += _resolve_ids(ids, cards)
            how = "--gpus device=" + ",".join(ids)
        elif count < 0:
            uuids += _resolve_ids(["all"], cards)
            how = "--gpus all"
        elif count > 0:
            # The daemon turns a count into the first N indices (NVIDIA_VISIBLE_DEVICES=0,1,...).
            uuids += _resolve_ids([str(i) for i in range(count)], cards)
            how = f"--gpus {count}"
    if not uuids and host.get("Runtime") == "nvidia":
        env = dict(e.split("=", 1) for e in (inspect.get("Config") or {}).get("Env") or [] if "=" in e)
        nvd = env.get("NVIDIA_VISIBLE_DEVICES", "")
        if nvd and nvd not in ("void", "none"):
            uuids = _resolve_ids(nvd.split(","), cards)
            how = f"runtime=nvidia NVIDIA_VISIBLE_DEVICES={nvd}"
    if not uuids:
        return None
    state = str((inspect.get("State") or {}).get("Status") or "unknown")
    return Holder(str(inspect["Id"]), str(inspect.get("Name") or "").lstrip("/"), state,
                  list(dict.fromkeys(uuids)), False, how)


def held(holders: Iterable[Holder]) -> dict[str, list[Holder]]:
    """Card UUID -> the containers that hold it now."""
    out: dict[str, list[Holder]] = {}
    for h in holders:
        if h.holds:
            for u in h.uuids:
                out.setdefault(u, []).append(h)
    return out


class HostLock:
    """A host-wide lock around "look, then create", one per Docker daemon (keyed by its address).

    flock(2): the kernel drops it when the holder exits or is killed, so a dead hostagent never blocks others.
    """

    def __init__(self, docker_host: str, directory: str | None = None) -> None:
        base = directory or os.environ.get("GPUPIN_LOCK_DIR") or (
            "/run/lock" if os.access("/run/lock", os.W_OK) else "/tmp")
        import hashlib  # here, not at the top: `hostagent ls` never takes the lock

        key = hashlib.sha256(docker_host.encode()).hexdigest()[:16]
        self.path = os.path.join(base, f"gpupin-ledger-{key}.lock")
        self._fd: int | None = None

    def acquire(self, timeout: float = 120.0) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            # Whoever creates it (root, under umask 022), every hostagent user must be able to open it again.
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)
        except PermissionError:
            fd = os.open(self.path, os.O_RDONLY)  # flock needs no write access
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise TimeoutError(f"another hostagent has held {self.path} for over {timeout:.0f} s") from None
                time.sleep(0.02)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
