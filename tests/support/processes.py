"""Processes on the simulated cards: the fake NVML's processes file (FAKEGPU_PROCESSES, re-read on each call:
tests/fakegpu/README.md) written from real pids, the one ERROR line a refusal prints, and real processes of other
uids in cgroups (and user namespaces) of their own making."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
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


def cgroup_root() -> Path:
    """Where a test makes cgroups: the v2 tree, or on a v1 or hybrid host one v1 hierarchy (pids)."""
    v2 = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
    return Path("/sys/fs/cgroup" if v2 == "cgroup2fs" else "/sys/fs/cgroup/pids")


class Placed:
    """Real processes of other uids in cgroups made for them (as a user's own systemd or runtime makes them), each
    optionally in a user namespace of its own (`unshare --user`, as a rootless runtime runs its containers): start()
    gives the pid; close() ends them and removes the cgroups it made. Needs root."""

    def __init__(self) -> None:
        self.root = cgroup_root()
        self.made: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, uid: int, path: str, userns: bool = False) -> int:
        """A `sleep` of `uid` in the cgroup `path` (relative to the root, made here and given to that uid)."""
        cg = self.root / path
        cg.mkdir(parents=True)
        os.chown(cg, uid, uid)
        inner = ["unshare", "--user", "--map-root-user", "sleep", "300"] if userns else ["sleep", "300"]
        p = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner])
        self.made.append((p, cg))
        (cg / "cgroup.procs").write_text(str(p.pid))
        assert f"/{path}" in Path(f"/proc/{p.pid}/cgroup").read_text()
        if userns:  # unshare has made the namespace once it has exec'd sleep
            for _ in range(100):
                if Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep":
                    break
                time.sleep(0.05)
        return p.pid

    def close(self) -> None:
        for p, _ in self.made:
            p.kill()
            p.wait()
        for _, cg in self.made:
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            for parent in cg.parents:
                if parent == self.root:
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break  # not ours, or not empty
