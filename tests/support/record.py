"""The resident agent's record, as the docker-tier tests read it: its intervals (read-only, as `hostagent usage`
opens it) and a container's own run time, from the daemon."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from gpupin.hostagent.engine.reads import created_time
from tests.support.sandbox import Agent


def intervals(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cur = conn.execute("SELECT * FROM intervals ORDER BY id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()


def run_time(agent: Agent, container: str) -> tuple[float, float]:
    """The container's State.StartedAt and State.FinishedAt, seconds since the epoch."""
    out = agent.sandbox.docker("inspect", "--format", "{{json .State}}", container, check=True).stdout
    state = json.loads(out)
    return created_time(state["StartedAt"]), created_time(state["FinishedAt"])
