"""Processes on the simulated cards: the fake NVML's processes file (FAKEGPU_PROCESSES, re-read on each call:
tests/fakegpu/README.md) written from real pids, and the one ERROR line a refusal prints."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path
from typing import Any

ME = pwd.getpwuid(os.getuid()).pw_name  # the user of the host processes the tests start


def on_cards(path: Path, uses: dict[str, Any]) -> dict[str, str]:
    """The fake NVML reports these processes ({uuid: [pid, ...] or an NVML error name}); the env that says so."""
    path.write_text(
        json.dumps(
            {u: v if isinstance(v, str) else [{"pid": p, "used_memory_mib": 256} for p in v] for u, v in uses.items()}
        )
    )
    return {"FAKEGPU_PROCESSES": str(path)}


def error_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == code and len(errors) == 1 and "Traceback" not in r.stderr, r
    return errors[0]
