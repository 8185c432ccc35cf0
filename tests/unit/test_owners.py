"""The owners the agent proves (gpupin.hostagent.ledger.owners, gpupin.hostagent.serve.owners): the file a reader
believes only where no one but root (or itself) could have written it, each holder's owner in the view, and the
owners of containers gone forgotten, never those of a container just made. On the daemon:
tests/docker/test_forged_booking.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ledger import booking, owners
from gpupin.hostagent.ls import listing
from gpupin.hostagent.ls.model import Listing, OwnerShown
from gpupin.hostagent.serve import owners as serve_owners

pytestmark = pytest.mark.timeout(30)


def view(*holders: dict[str, Any], docker: bool = True) -> Listing:
    return Listing.from_json({"docker": {"available": docker}, "gpus": [{"index": 0, "holders": list(holders)}]})


def holder(cid: str, uid: int | None = None) -> dict[str, Any]:
    b = None if uid is None else {"uid": uid, "since": 100, "until": 200}
    return {"id": cid, "name": f"n-{cid}", "holds": True, "booking": b}


def test_a_file_another_user_could_write_proves_nothing(tmp_path: Path) -> None:
    (tmp_path / owners.STATE_FILE).write_bytes(owners.dump({"a" * 64: (1001, 1.0)}))
    os.chmod(tmp_path, 0o755)
    assert owners.read(str(tmp_path)) == {"a" * 64: (1001, 1.0)}
    os.chmod(tmp_path, 0o777)  # anyone could have put it there
    assert owners.read(str(tmp_path)) == {}
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / owners.STATE_FILE, 0o666)
    assert owners.read(str(tmp_path)) == {}
    (tmp_path / owners.STATE_FILE).unlink()
    os.symlink("/etc/passwd", tmp_path / owners.STATE_FILE)
    assert owners.read(str(tmp_path)) == {}


def test_a_warning_mark_is_believed_only_from_the_agents_own_file(tmp_path: Path) -> None:
    """`ls` marks what mode warn let in from warned.json beside the owners: a file another user could have written
    (to mark someone else's container, or to hide a mark) is read as no marks at all."""
    marks = {"a" * 64: ("gpupin: only the agent's containers may take cards on this host", 1.0)}
    (tmp_path / owners.WARNED_FILE).write_bytes(owners.dump_warned(marks))
    os.chmod(tmp_path, 0o755)
    assert owners.read_warned(str(tmp_path)) == marks
    os.chmod(tmp_path / owners.WARNED_FILE, 0o666)
    assert owners.read_warned(str(tmp_path)) == {}
    (tmp_path / owners.WARNED_FILE).unlink()
    os.symlink("/etc/passwd", tmp_path / owners.WARNED_FILE)
    assert owners.read_warned(str(tmp_path)) == {}
    v = view(holder("marked"), holder("plain"))
    listing.own(v, {}, warned={"marked": "gpupin: card 1 is held by x"})
    assert [h.warned for h in v.gpus[0].holders] == ["gpupin: card 1 is held by x", None]


def test_entries_not_of_the_form_are_left_out() -> None:
    data = {"a": {"uid": 5, "at": 1}, "b": {"uid": True, "at": 1}, "c": {"uid": -1, "at": 1}, "d": 7, "e": {"uid": 2}}
    assert owners.parse(data) == {"a": (5, 1.0)}
    assert owners.parse([1, 2]) == {}


def test_each_holder_is_owned_by_the_proven_uid_else_unverified_with_its_claim() -> None:
    v = view(holder("mine", 1001), holder("forged", 1001), holder("plain"))
    listing.own(v, {"mine": 0})
    got = {h.id: h.owner for h in v.gpus[0].holders}
    assert got["mine"] == OwnerShown(0, "root", True, None)
    assert got["forged"] == OwnerShown(None, None, False, 1001)
    assert got["plain"] == OwnerShown(None, None, False, None)
    assert v.to_json()["gpus"][0]["holders"][1]["owner"] == {
        "uid": None,
        "name": None,
        "verified": False,
        "claimed_uid": 1001,
    }


def test_the_agent_keeps_owners_across_a_restart_and_forgets_the_gone(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    kept = serve_owners.Owners()
    kept.keep_in(str(tmp_path))
    kept.note("new", 1001)
    kept.note("old", 1002)
    assert not (tmp_path / owners.STATE_FILE).exists()  # no disk in a run's path
    kept.flush()  # once the caller has its answer
    assert oct(os.stat(tmp_path / owners.STATE_FILE).st_mode & 0o777) == "0o644"
    again = serve_owners.Owners()
    again.keep_in(str(tmp_path))
    assert again.uids() == {"new": 1001, "old": 1002}
    with again._lock:  # noted long ago
        again._owners["old"] = (1002, time.time() - serve_owners.GRACE_S - 1)
    again.annotate(view(holder("other"), docker=False))  # the daemon unread: nothing forgotten
    assert again.uids() == {"new": 1001, "old": 1002}
    again.annotate(view(holder("other")))  # "new" was noted a moment ago: a view may not show it yet
    assert again.uids() == {"new": 1001}
    assert owners.uids(owners.read(str(tmp_path))) == {"new": 1001}


def test_the_record_proves_an_owner_the_file_lost() -> None:
    asked: list[str] = []

    def lookup(cid: str) -> int | None:
        asked.append(cid)
        return 1001 if cid == "rebooted" else None

    o = serve_owners.Owners(lookup)
    v = view(holder("rebooted", 1001), holder("forged", 1001), holder("plain"))
    o.annotate(v)
    o.annotate(v)
    assert asked == ["rebooted", "forged"]  # once each, and only for a booking label
    assert [h.owner.verified for h in v.gpus[0].holders if h.owner] == [True, False, False]


def test_ls_shows_the_end_the_agent_gave_a_claim(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    (tmp_path / booking.JUDGED_FILE).write_text(json.dumps({"forged": 150, "mine": 999}))
    v = view(holder("forged", 1001), holder("mine", 1001))
    listing.own(v, {"mine": 1001})
    listing.judge(v, booking.read_judged(str(tmp_path)))
    ends = {h.id: h.booking.until for h in v.gpus[0].holders if h.booking}
    assert ends == {"forged": 150, "mine": 200}  # the agent's own booking keeps its label's end
