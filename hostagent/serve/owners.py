"""The owners the agent can prove: the uid it took at accept for each container it created, noted when the create
answers and kept in `owners.json` beside the socket (gpupin.hostagent.ledger.owners), written once the caller is
answered (no disk in a run's path), so that a restart keeps them. Quotas, idle exemptions, `extend` and the record
read only these; a booking label on any other container is a claim (docs/design.md, "Who is trusted for what").

A container the file does not name (the agent's folder was cleared by a reboot, or an agent of an earlier version
made it) is looked up once in the record's owners, which the agent alone writes too.
"""

from __future__ import annotations

import os
import threading
import time

from gpupin.core.errors import GpupinError
from gpupin.hostagent.ledger import owners
from gpupin.hostagent.ls import listing
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpupin.hostagent.ls.model import Listing

# A container noted this recently is kept though no view has shown it yet: the ledger is read again at the create's
# event, or at the next resync (30 s), and a view read before the create must not drop its owner.
GRACE_S = 600.0
KEPT = 50_000  # entries at most (the file stays within owners.LIMIT); the oldest go first


class Owners:
    def __init__(self, lookup: Callable[[str], int | None] | None = None) -> None:
        """`lookup(cid)`: the record's owner of a container (None: none, or no record)."""
        self._lock = threading.Lock()
        self._owners: dict[str, tuple[int, float]] = {}
        self._warned: dict[str, tuple[str, float]] = {}  # what mode warn let in (gpupin.hostagent.ledger.owners)
        self._state: str | None = None
        self._lookup = lookup
        self._looked: set[str] = set()  # ids looked up in the record already (found or not)
        self._names: dict[int, str] = {}
        self._dirty = False  # noted, not written yet
        self._failed = False  # the last write failed (said once)

    def keep_in(self, directory: str) -> None:
        """Keep the owners in `directory` (the socket's, the agent's own), and take those an earlier agent left
        there; in a directory others may write, in memory only (the readers would not believe the file)."""
        if not owners.trusted(os.stat(directory)) or os.stat(directory).st_uid != os.geteuid():
            say(f"owners of containers are kept in memory only: {directory} is not the agent's own directory")
            return
        self._state = os.path.join(directory, owners.STATE_FILE)
        with self._lock:
            self._owners.update(owners.read(directory))
            self._warned.update(owners.read_warned(directory))

    def _save(self) -> None:
        if self._state is None:
            return
        from gpupin.core.files import write_atomic

        if len(self._owners) > KEPT:
            for cid in sorted(self._owners, key=lambda c: self._owners[c][1])[: len(self._owners) - KEPT]:
                del self._owners[cid]
        if len(self._warned) > KEPT:
            for cid in sorted(self._warned, key=lambda c: self._warned[c][1])[: len(self._warned) - KEPT]:
                del self._warned[cid]
        warned = os.path.join(os.path.dirname(self._state), owners.WARNED_FILE)
        for path, data in ((self._state, owners.dump(self._owners)), (warned, owners.dump_warned(self._warned))):
            write_atomic(path, data)
            os.chmod(path, 0o644)  # every user's `ls` reads it, whatever the agent's umask (root alone writes it)

    def note(self, cid: str, uid: int) -> None:
        """The agent created `cid` for `uid`: in memory at once (the next run's quota counts it, under the same
        ledger lock), in the file at `flush()`."""
        with self._lock:
            self._owners[cid] = (uid, time.time())
            self._looked.discard(cid)
            self._dirty = True

    def warn(self, cid: str, line: str) -> None:
        """The authorization plugin let `cid` in under enforce mode warn, where mode on would have refused it with
        `line`: shown in `ls` and on the page; written at once (a create's answer waits on it, no run does)."""
        with self._lock:
            self._warned[cid] = (line, time.time())
            self._dirty = True
        self.flush()

    def flush(self) -> None:
        """Write what was noted since the last write: after a run's answer is sent (no disk in a run's path), and
        at each refresh. A file that cannot be written is said once; the owners stay in memory and are tried again."""
        with self._lock:
            if not self._dirty:
                return
            try:
                self._save()
                self._dirty = False
                self._failed = False
            except (GpupinError, OSError) as err:
                if not self._failed:
                    say(f"owners of containers are kept in memory only for now: {getattr(err, 'message', err)}")
                self._failed = True

    def get(self, cid: str) -> int | None:
        with self._lock:
            found = self._owners.get(cid)
        return None if found is None else found[0]

    def uids(self) -> dict[str, int]:
        """Container id -> the uid the agent created it for."""
        with self._lock:
            return owners.uids(self._owners)

    def annotate(self, view: Listing) -> None:
        """Each holder's owner (gpupin.hostagent.ls.listing.own); the record asked once about a booked container the
        file does not name; and the owners of containers that are gone forgotten (only from a view the daemon
        answered, and not before GRACE_S after they were noted)."""
        holders = {h.id: h for card in view.gpus for h in (*card.holders, *card.mislabelled)}
        if self._lookup is not None:
            for cid, h in holders.items():
                if h.booking is not None and h.booking.uid is not None:
                    self._adopt(cid)
        with self._lock:
            if view.docker.available:
                old = time.time() - GRACE_S
                for kept in (self._owners, self._warned):
                    for cid in [c for c, (_, at) in kept.items() if c not in holders and at < old]:
                        del kept[cid]
                        self._dirty = True
                self._looked &= set(holders)
            proven = owners.uids(self._owners)
            warned = {c: line for c, (line, _) in self._warned.items()}
        self.flush()
        listing.own(view, proven, self._names, warned)

    def _adopt(self, cid: str) -> None:
        with self._lock:
            if cid in self._owners or cid in self._looked or self._lookup is None:
                return
            self._looked.add(cid)
        uid = self._lookup(cid)
        if uid is not None:
            self.note(cid, uid)
