"""The ledger as the daemon has it: one list of the containers, an inspect for each that may hold a card, and the
image of each container that carries a gpupin label (its own or inherited:
gpupin.hostagent.ledger.holders.not_inherited)."""

from __future__ import annotations

from gpupin.core.contract import LOCK_LABEL
from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent.engine import podman
from gpupin.hostagent.engine.address import endpoint
from gpupin.hostagent.engine.daemon import info, runtimes
from gpupin.hostagent.engine.failures import EngineNotFound
from gpupin.hostagent.engine.reads import fetch
from gpupin.hostagent.ledger import holders as ledger
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.ledger.holders import worth_inspecting
from gpupin.hostagent.ledger.holding_forms import HostCards
from gpupin.hostagent.ledger.processes import ContainerCgroups

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.engine.answer import DaemonAnswer


STARTING_INSPECT_S = 2.0  # how long the inspect of a container in the middle of its start may take


class LedgerReading:
    """One reading of the ledger: the holders, the abandoned containers (created by a hostagent whose lease is
    dead or expired, never started), the name of every container (id -> name: whose a GPU process is), where
    each running one is (its cgroup and pid namespace: gpupin.hostagent.ledger.processes.ContainerCgroups) and the
    daemon's clock at the reading."""

    __slots__ = ("holders", "names", "now", "orphans", "places")

    def __init__(
        self,
        holders: list[ledger.Holder],
        orphans: list[DaemonAnswer],
        now: float,
        names: dict[str, str] | None = None,
        places: ContainerCgroups | None = None,
    ) -> None:
        self.holders = holders
        self.orphans = orphans
        self.now = now
        self.names = names if names is not None else {}
        self.places = places if places is not None else ContainerCgroups({}, None, self.names)


def read_ledger(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None) -> LedgerReading:
    """Every container that holds a card (ledger.FORMS, ledger.holding), every pinned container that does not
    (for `ls`), and the abandoned ones. One list; an inspect for each container that may hold. `daemon_info`: the
    daemon's /info when the caller has it (else it is asked only if a container names a runtime)."""
    import time

    summaries, now = fetch(api, "/containers/json", {"all": "1"})
    now = now if now is not None else time.time()  # the Go server always sends Date; just in case
    host = HostCards(
        cards,
        lambda: runtimes(daemon_info if daemon_info is not None else info(api)),
        local=endpoint().unix_path is not None,
    )
    images: dict[str, dict[str, str]] = {}
    holders: list[ledger.Holder] = []
    orphans: list[DaemonAnswer] = []
    names = {str(s["Id"]): ledger.name_of(s) for s in summaries}
    places: dict[str, tuple[int, str]] = {}  # id -> (State.Pid, HostConfig.CgroupParent) of each running one
    for s in summaries:
        state = str(s.get("State") or "")
        labels = s.get("Labels") or {}
        if ledger.gpupin_labels(labels) and LOCK_LABEL not in labels:  # the lock is made by hostagent alone
            labels = ledger.not_inherited(labels, _image_labels(api, str(s.get("ImageID") or ""), images))
        lease_state = None
        if state == "created" and lease.OWNER_LABEL in labels:
            cid = str(s["Id"])
            lease_state = lease.state(
                labels,
                float(s.get("Created") or 0),
                now,
                lambda cid=cid: lease.renewed_at(api, cid),  # type: ignore[misc]
            )
            if lease_state != lease.LIVE:
                orphans.append(s)
        if LOCK_LABEL in labels and state == "created":
            continue  # the ledger lock, or a resident agent's spare of it: never started, it holds nothing
        h: ledger.Holder | None
        if worth_inspecting(state, lease_state):
            # A container being started cannot be inspected until its start ends (the daemon holds it meanwhile,
            # and the NVIDIA hook can take a minute): asked briefly, then read from its list summary.
            starting = lease_state == lease.LIVE
            try:
                data = fetch(api, f"/containers/{s['Id']}/json", timeout=STARTING_INSPECT_S if starting else None)[0]
                pid = (data.get("State") or {}).get("Pid")
                if isinstance(pid, int) and pid > 0:
                    places[str(s["Id"])] = (pid, str((data.get("HostConfig") or {}).get("CgroupParent") or ""))
                if host.local and podman.version(api) and state in ("running", "paused"):
                    podman.read_oci_spec(api, str(s["Id"]), data)
                h = ledger.holder(data, host, lease_state, labels)
            except EngineNotFound:
                continue  # it went away between the list and the inspect
            except DockerUnavailableError:
                if not starting:
                    raise
                h = ledger.starting_holder(s, host, labels)
        else:
            h = ledger.label_holder(s, cards, labels)
        if h is not None:
            holders.append(h)
    # The cgroup driver: /info's when the caller has it, else asked once when a process's cgroup must be told.
    driver = (
        str(daemon_info.get("CgroupDriver") or "")
        if daemon_info is not None
        else lambda: str(info(api).get("CgroupDriver") or "")
    )
    return LedgerReading(holders, orphans, now, names, ContainerCgroups(places, driver, names))


def _image_labels(api: Any, image_id: str, seen: dict[str, dict[str, str]]) -> dict[str, str]:
    """The labels of the container's image (its config's), read once per image; none when it is gone."""
    if image_id not in seen:
        try:
            data = fetch(api, f"/images/{image_id}/json")[0] if image_id else {}
        except EngineNotFound:
            data = {}
        seen[image_id] = dict((data.get("Config") or {}).get("Labels") or {})
    return seen[image_id]


def read_holders(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None) -> list[ledger.Holder]:
    """The holders of read_ledger (what `run --dry-run`, `ls` and compose read)."""
    return read_ledger(api, cards, daemon_info).holders
