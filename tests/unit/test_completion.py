"""Shell completion, generated from the parsers, as bash, zsh and fish themselves complete with the scripts loaded:
subcommands; the values of every option that has them (argparse's choices and the words `offer` gives, e.g.
--restart, --via, --pull, --color); files where a path is expected (`compose render FILE`, -o, --env-file); GPU
specs from the simulated host's NVML after --gpu; and nothing of hostagent's after run's IMAGE."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpupin.core.contract import LEVELS
from gpupin.hostagent.cli import build_parser
from gpupin.hostagent.completion.model import commands
from tests.support.host import BIN, REPO, simhost_env
from tests.support.scenarios import uuids
from tests.support.spawn import default_signals

SHELLS = ("bash", "zsh", "fish")
ZSH_CAPTURE = REPO / "tests" / "support" / "complete.zsh"


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
        r = subprocess.run(
            [str(BIN / "hostagent"), "completion", shell],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out[shell] = folder / f"hostagent.{shell}"
        out[shell].write_text(r.stdout)
    return out


def bash(script: Path, line: str, cwd: Path | None = None, scenario: str = "mixed-4") -> list[str]:
    """COMPREPLY for `hostagent LINE` with the cursor at its end, given as bash gives it: COMP_LINE, COMP_POINT,
    and COMP_WORDS split at blanks and at bash's word breaks `:` and `=` (each run of them a word of its own)."""
    full = f"hostagent {line}"
    words = [w for token in full.split(" ") for w in re.findall(r"[:=]+|[^:=]+", token) or [""]]
    code = (
        f"source {script}; COMP_LINE={shlex.quote(full)}; COMP_POINT={len(full)}; "
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}; _hostagent; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    r = subprocess.run(
        [_shell("bash"), "--norc", "-c", code], env=_env(scenario), capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def zsh(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """The matches zsh's completion system offers for LINE<TAB> (tests/support/complete.zsh)."""
    r = subprocess.run(
        [_shell("zsh"), "-f", str(ZSH_CAPTURE), str(script), line],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def fish(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What fish's `complete -C LINE` offers (the candidates, without their descriptions)."""
    r = subprocess.run(
        [_shell("fish"), "--no-config", "-c", f"source {script}; complete -C {line!r}"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr
    return [w.split("\t")[0] for w in r.stdout.splitlines() if w]


def complete(shell: str, scripts: dict[str, Path], line: str, cwd: Path | None = None) -> set[str]:
    """What SHELL offers for `hostagent LINE` (the cursor at its end; a trailing space starts a new word)."""
    if shell == "bash":
        return set(bash(scripts["bash"], line, cwd=cwd))
    full = f"hostagent {line}"
    return set(zsh(scripts["zsh"], full, cwd) if shell == "zsh" else fish(scripts["fish"], full, cwd))


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("line", "values"),
    [
        ("run --restart ", {"no", "always", "unless-stopped", "on-failure"}),
        ("run --via ", {"cdi", "nvidia"}),
        ("run --pull ", {"missing", "never", "always"}),
        ("ls --color ", {"auto", "always", "never"}),
        ("run --verify ", set(LEVELS)),
        ("compose render --via ", {"cdi", "nvidia"}),
        ("completion ", set(SHELLS)),
    ],
)
def test_an_option_with_values_offers_its_values(
    shell: str, scripts: dict[str, Path], line: str, values: set[str]
) -> None:
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


def test_bash_completes_specs_with_colons_as_one_word(scripts: dict[str, Path]) -> None:
    """bash breaks words at `:`: the reply is what replaces the part after the last one."""
    assert set(bash(scripts["bash"], "run --gpu 0:", scenario="mig")) == {":0", ":1"}  # the word is `:`
    assert set(bash(scripts["bash"], "run --gpu 0:0", scenario="mig")) == {"0"}
    assert bash(scripts["bash"], "run --gpu 00000000:3") == ["3B:00.0"]
    assert set(bash(scripts["bash"], "run --gpu 00000000:3B:00.0 --r")) == {
        "--read-only",
        "--restart",
        "--rm",
        "--runtime",
    }


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
    # bash breaks `--restart=al` at the `=`: its current word is `al` (or `=` right after it)
    assert bash(scripts["bash"], "run --restart=al") == ["always"]
    assert set(bash(scripts["bash"], "run --via=")) == {"=cdi", "=nvidia"}
    assert "--rm" in bash(scripts["bash"], "run --name=job --r")
    assert bash(scripts["bash"], "run --name=job img --r") == []  # img is the IMAGE: --name took its value


def test_a_value_with_nothing_to_offer_offers_no_options(scripts: dict[str, Path]) -> None:
    """The issue's bug: after `--name` (or any option that takes a value) bash offered hostagent's options."""
    assert bash(scripts["bash"], "run --name ") == []
    assert bash(scripts["bash"], "compose render --kind ") == []


def test_every_value_the_parser_knows_is_offered_by_bash_and_fish(scripts: dict[str, Path]) -> None:
    """Generated from the parser: each option's values, in every command, whatever is added later."""
    checked = 0
    for command in commands(build_parser()):
        for option in command.options:
            if option.values is None:
                continue
            line = f"{command.path} {option.flags[-1]} ".lstrip()
            assert set(bash(scripts["bash"], line)) == set(option.values), line
            assert set(fish(scripts["fish"], f"hostagent {line}")) == set(option.values), line
            checked += 1
    assert checked >= 8  # --via (run, render), --verify, --color, --pull, --restart, --gpu-capabilities


class Terminal:
    """An interactive bash on a pseudo-terminal, for what only readline shows: the line after a TAB."""

    def __init__(self, script: Path, cwd: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: an interactive bash without the user's files
            default_signals()
            os.chdir(cwd)
            os.execve(_shell("bash"), ["bash", "--norc", "--noprofile", "-i"], _env())
        self.screen = ""
        self.type(f"PS1='READY''> '; source {script}; bind 'set show-all-if-ambiguous on'\n")
        self.wait_for("READY> ")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait_for(self, text: str, timeout: float = 20) -> str:
        """The output up to `text` (a condition, not a sleep: it returns as soon as it shows)."""
        deadline = time.monotonic() + timeout
        while text not in self.screen and time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.2)[0]:
                self.screen += os.read(self.fd, 4096).decode(errors="replace")
        assert text in self.screen, f"{text!r} never showed: {self.screen[-300:]!r}"
        shown, self.screen = self.screen.split(text, 1)
        return shown

    def close(self) -> None:
        os.close(self.fd)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)


@pytest.mark.parametrize(
    ("typed", "line"),
    [
        ("hostagent run --gpu 00000000:3", "hostagent run --gpu 00000000:3B:00.0 "),
        ("hostagent run --restart=al", "hostagent run --restart=always "),
        ("hostagent compose render tr", "hostagent compose render train.yml "),
    ],
)
def test_readline_completes_the_line_in_place(scripts: dict[str, Path], tmp_path: Path, typed: str, line: str) -> None:
    """bash itself, as a user meets it: the words bash breaks at `:` and `=` come back whole."""
    (tmp_path / "train.yml").write_text("services: {}\n")
    term = Terminal(scripts["bash"], tmp_path)
    try:
        term.type(typed + "\t")
        term.wait_for(line)
    finally:
        term.close()
