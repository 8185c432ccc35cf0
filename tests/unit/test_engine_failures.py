"""How the daemon's failures are read (gpupin.hostagent.engine.failures): which answers say a container name is
taken, so that the ledger lock waits for its holder instead of failing the run."""

from __future__ import annotations

from gpupin.hostagent.engine import is_conflict
from gpupin.hostagent.engine.failures import EngineError


def test_a_name_let_go_while_the_daemon_reserved_it_is_a_conflict() -> None:
    # moby's reserveName: the name was taken when it tried, and let go (the holder removed) before it looked up by
    # whom; Engine 26 answered a lock's create so under 32 clients at once (a run exited 69 for it).
    assert is_conflict(EngineError(500, "name is not reserved"))
    assert is_conflict(EngineError(409, 'Conflict. The container name "/gpupin-ledger-lock" is already in use'))
    assert not is_conflict(EngineError(500, "failed to create shim task: OCI runtime create failed"))
    assert not is_conflict(EngineError(400, "name is not reserved"))
