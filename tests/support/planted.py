"""Files that someone who can write a folder gpupin reads plants there, to hang or exhaust whoever reads it (issue
24: every file read is bounded in size and time)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpupin.hostagent.engine import cdi


def plant_hostile_specs(folder: Path) -> None:
    """CDI spec files that someone who can write a spec folder plants to hang or exhaust whoever reads it."""
    os.mkfifo(folder / "fifo.yaml")  # opened for reading, waits for a writer that never comes
    (folder / "zero.json").symlink_to("/dev/zero")  # a read without end
    huge = {"kind": "nvidia.com/gpu", "devices": [{"name": "9", "pad": "x" * cdi.MAX_BYTES}]}
    (folder / "huge.json").write_text(json.dumps(huge))
    (folder / "deep.json").write_text('{"kind": "nvidia.com/gpu", "devices": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (folder / "deep.yaml").write_text("kind: nvidia.com/gpu\ndevices: " + "[" * 10_000 + "]" * 10_000 + "\n")
    # A YAML alias bomb: 10**9 names once expanded, a few hundred bytes as written.
    bomb = ["kind: nvidia.com/gpu", 'l0: &l0 ["xxxxxxxxxx"]']
    bomb += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    (folder / "bomb.yaml").write_text("\n".join([*bomb, "devices: [{name: *l9}]", ""]))
