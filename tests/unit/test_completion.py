"""Shell completion, generated from the parsers: bash completes subcommands, run's options and GPU specs from the
simulated host's NVML, and stops at IMAGE; zsh's script loads under compinit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.host import BIN, simhost_env
from tests.support.scenarios import uuids


def complete(*words: str, scenario: str = "mixed-4") -> list[str]:
    """COMPREPLY for `hostagent WORDS...` with the cursor on the last word."""
    line = " ".join(["hostagent", *words])
    script = (f'eval "$(hostagent completion bash)"; COMP_WORDS=(hostagent {" ".join(repr(w) for w in words)}); '
              f'COMP_CWORD={len(words)}; COMP_LINE={line!r}; _hostagent; printf "%s\\n" "${{COMPREPLY[@]}}"')
    env = simhost_env(scenario, PATH=f"{BIN}:{os.environ['PATH']}")
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completes_subcommands_and_options() -> None:
    assert set(complete("")) >= {"ls", "run", "compose", "completion", "--debug", "--version"}
    assert "__complete" not in complete("")
    assert complete("r") == ["run"]
    assert set(complete("run", "--gpu-c")) == {"--gpu-capabilities"}
    assert set(complete("compose", "")) >= {"render", "check"}
    assert "--json" in complete("ls", "--")


def test_bash_completes_gpu_specs_from_nvml() -> None:
    rtx = uuids("mixed-4")[1]
    assert rtx in complete("run", "--gpu", "GPU-95")
    assert set(complete("run", "--gpu", "")) >= {"0", "1", "2", "3", rtx, "00000000:3B:00.0"}
    assert set(complete("run", "--gpu", "0:", scenario="mig")) == {"0:0", "0:1"}  # MIG devices by index pair


def test_bash_stops_at_the_image() -> None:
    # after IMAGE the words are the container's command: hostagent's options are not offered there
    assert complete("run", "--gpu", "1", "img", "--r") == []
    assert set(complete("run", "--gpu", "1", "--r")) == {"--rm", "--read-only", "--restart", "--runtime"}


def test_zsh_script_loads_under_compinit() -> None:
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.fail("zsh is missing (make test installs it)")
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    r = subprocess.run([zsh, "-f", "-c", 'autoload -U compinit; compinit -u; eval "$(hostagent completion zsh)"; '
                        'print ${+functions[_hostagent_run]} ${+functions[_hostagent_compose_render]} '
                        '${_comps[hostagent]}'], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "_hostagent"]


def test_bash_completes_file_names_after_node_configs_paths(tmp_path: Path) -> None:
    (tmp_path / "daemon.json").write_text("{}")
    for option in ("--daemon-json", "--toolkit-config", "--runtime-path"):
        assert complete("swarm", "node-config", option, f"{tmp_path}/dae") == [f"{tmp_path}/daemon.json"], option
    assert set(complete("ls", "--")) >= {"--json", "--swarm"}
    assert set(complete("compose", "render", "--")) >= {"--swarm", "--kind", "--output"}
