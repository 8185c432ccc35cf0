"""Shell completion, generated from the parsers, as bash, zsh and fish themselves complete with the scripts loaded:
subcommands; the values of every option that has them (argparse's choices and the words `offer` gives, e.g.
--restart, --via, --pull, --color); files where a path is expected (`compose render FILE`, -o, --env-file); GPU
specs from the simulated host's NVML after --gpu; and nothing of hostagent's after run's IMAGE."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpupin.core.contract import LEVELS
from gpupin.hostagent.cli import build_parser
from gpupin.hostagent.completion.model import commands
from tests.cards import uuids
from tests.conftest import BIN, simhost_env

SHELLS = ("bash", "zsh", "fish")
ZSH_CAPTURE = Path(__file__).with_name("complete.zsh")


def _env(scenario: str = "mixed-4") -> dict[str, str]:
    return simhost_env(scenario, PATH=f"{BIN}:{os.environ['PATH']}")


def _shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing (make test-tools installs it)")
    return found


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each shell's script, as `hostagent completion SHELL` prints it."""
    folder = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in SHELLS:
        r = subprocess.run([str(BIN / "hostagent"), "completion", shell], env=_env(), capture_output=True, text=True,
                           timeout=60, check=True)
        out[shell] = folder / f"hostagent.{shell}"
        out[shell].write_text(r.stdout)
    return out


def bash(script: Path, *words: str, cwd: Path | None = None, scenario: str = "mixed-4") -> list[str]:
    """COMPREPLY for `hostagent WORDS...` with the cursor on the last word (bash's split of the line)."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    code = (f'source {script}; COMP_WORDS=(hostagent {quoted}); COMP_CWORD={len(words)}; _hostagent; '
            'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run([_shell("bash"), "--norc", "-c", code], env=_env(scenario), capture_output=True, text=True,
                       timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def zsh(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """The matches zsh's completion system offers for LINE<TAB> (tests/complete.zsh)."""
    r = subprocess.run([_shell("zsh"), "-f", str(ZSH_CAPTURE), str(script), line], env=_env(), capture_output=True,
                       text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def fish(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What fish's `complete -C LINE` offers (the candidates, without their descriptions)."""
    r = subprocess.run([_shell("fish"), "--no-config", "-c", f"source {script}; complete -C {line!r}"], env=_env(),
                       capture_output=True, text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [w.split("\t")[0] for w in r.stdout.splitlines() if w]


def complete(shell: str, scripts: dict[str, Path], line: str, cwd: Path | None = None) -> set[str]:
    """What SHELL offers for `hostagent LINE` (the cursor at its end; a trailing space starts a new word)."""
    if shell == "bash":
        words = line.split(" ")
        return set(bash(scripts["bash"], *words, cwd=cwd))
    full = f"hostagent {line}"
    return set(zsh(scripts["zsh"], full, cwd) if shell == "zsh" else fish(scripts["fish"], full, cwd))


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("line", "values"), [
    ("run --restart ", {"no", "always", "unless-stopped", "on-failure"}),
    ("run --via ", {"cdi", "nvidia"}),
    ("run --pull ", {"missing", "never", "always"}),
    ("ls --color ", {"auto", "always", "never"}),
    ("run --verify ", set(LEVELS)),
    ("compose render --via ", {"cdi", "nvidia"}),
    ("completion ", set(SHELLS)),
])
def test_an_option_with_values_offers_its_values(shell: str, scripts: dict[str, Path], line: str,
                                                 values: set[str]) -> None:
    assert complete(shell, scripts, line) == values


@pytest.mark.parametrize("shell", SHELLS)
def test_files_where_a_path_is_expected(shell: str, scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "train.yml").write_text("services: {}\n")
    (tmp_path / "train.env").write_text("A=1\n")
    for line in ("compose render ", "compose check ", "compose render train.yml -o ", "run --env-file "):
        offered = complete(shell, scripts, line, cwd=tmp_path)
        assert {"train.yml", "train.env"} <= offered, (line, offered)
        assert not any(w.startswith("-") for w in offered), (line, offered)
    assert complete(shell, scripts, "compose render train.yml -o train.y", cwd=tmp_path) == {"train.yml"}


@pytest.mark.parametrize("shell", SHELLS)
def test_gpu_specs_come_from_nvml(shell: str, scripts: dict[str, Path]) -> None:
    rtx = uuids("mixed-4")[1]
    assert complete(shell, scripts, "run --gpu ") >= {"0", "1", "2", "3", rtx, "00000000:3B:00.0"}
    assert complete(shell, scripts, "run --gpu GPU-95") == {rtx}
    assert rtx in complete(shell, scripts, "run --uuid ")


def test_bash_completes_mig_devices_by_index_pair(scripts: dict[str, Path]) -> None:
    assert set(bash(scripts["bash"], "run", "--gpu", "0:", scenario="mig")) == {"0:0", "0:1"}


@pytest.mark.parametrize("shell", SHELLS)
def test_subcommands_and_options(shell: str, scripts: dict[str, Path]) -> None:
    top = complete(shell, scripts, "")
    assert top >= {"ls", "run", "compose", "completion", "swarm", "doctor"} and "__complete" not in top
    assert complete(shell, scripts, "compose ") >= {"render", "check"}
    assert complete(shell, scripts, "swarm ") >= {"node-config"}
    assert complete(shell, scripts, "run --gpu 1 --r") == {"--rm", "--read-only", "--restart", "--runtime"}
    assert complete(shell, scripts, "compose render --") >= {"--swarm", "--kind", "--output", "--via"}


@pytest.mark.parametrize("shell", SHELLS)
def test_after_the_image_the_words_are_the_containers(shell: str, scripts: dict[str, Path]) -> None:
    assert not any(w.startswith("--r") for w in complete(shell, scripts, "run --gpu 1 img --r"))
    assert not any(w.startswith("--r") for w in complete(shell, scripts, "run --name job -w /x img python --r"))


def test_bash_reads_option_values_given_with_an_equals_sign(scripts: dict[str, Path]) -> None:
    # bash splits `--restart=al` at the `=` (COMP_WORDBREAKS): words `--restart`, `=`, `al`
    assert bash(scripts["bash"], "run", "--restart", "=", "al") == ["always"]
    assert "--rm" in bash(scripts["bash"], "run", "--name", "=", "job", "--r")


def test_a_value_with_nothing_to_offer_offers_no_options(scripts: dict[str, Path]) -> None:
    """The issue's bug: after `--name` (or any option that takes a value) bash offered hostagent's options."""
    assert bash(scripts["bash"], "run", "--name", "") == []
    assert bash(scripts["bash"], "compose", "render", "--kind", "") == []


def test_every_value_the_parser_knows_is_offered_by_bash_and_fish(scripts: dict[str, Path]) -> None:
    """Generated from the parser: each option's values, in every command, whatever is added later."""
    checked = 0
    for command in commands(build_parser()):
        for option in command.options:
            if option.values is None:
                continue
            line = f"{command.path} {option.flags[-1]} ".lstrip()
            assert set(bash(scripts["bash"], *line.split(" "))) == set(option.values), line
            assert set(fish(scripts["fish"], f"hostagent {line}")) == set(option.values), line
            checked += 1
    assert checked >= 8  # --via (run, render), --verify, --color, --pull, --sig-proxy, --restart, --gpu-capabilities
