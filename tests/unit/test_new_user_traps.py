"""What a new user met before gpupin itself (issue 23): apt that gives up when another apt holds its lock (trap 5),
and product messages that gave the test harness's advice (trap 10). The checkout's own files, no daemon."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpupin.hostagent.engine import failures
from tests.support.host import REPO

LOCK_WAIT = "-o DPkg::Lock::Timeout=600"


def _commands(path: Path) -> str:
    """A shell script's or Makefile's text as commands: continued lines joined, comments and quoted strings (the
    messages, which may name apt-get as advice) left out."""
    text = path.read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', "\n".join(lines))


def test_every_apt_get_waits_for_the_lock() -> None:
    """Issue 23, trap 5: `make demo` failed at once while unattended-upgrades held apt's lock. Every apt-get the
    Makefile, CI and the sandbox scripts run waits for it (DPkg::Lock::Timeout covers the lists lock too, apt 2.6)."""
    files = [REPO / "Makefile", REPO / ".ci" / "run", *sorted((REPO / "tests" / "sandbox").glob("*.sh"))]
    calls = {f.relative_to(REPO).as_posix(): _commands(f).count("apt-get") for f in files}
    assert calls["Makefile"] and calls[".ci/run"] and calls["tests/sandbox/common.sh"], calls
    for f in files:
        for m in re.finditer(r"\bapt-get\b(.{0,40})", _commands(f)):
            assert m.group(1).startswith(" " + LOCK_WAIT), f"{f.relative_to(REPO)}: apt-get{m.group(1)}"


def _messages(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (what it may print), with their lines."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_product_message_gives_the_test_harness_advice() -> None:
    """Issue 23, trap 10: a daemon that stopped answering was told to `make sandbox-up`, advice for this
    checkout's tests. What core, entrypoint and hostagent print speaks to a user of a real host."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for top in ("core", "entrypoint", "hostagent")
        for path in sorted((REPO / top).rglob("*.py"))
        for line, text in _messages(path)
        if re.search(r"sandbox|`make |fakegpu|FAKEGPU_", text)
    ]
    assert not found, "\n".join(found)
    hint = failures.unavailable(ConnectionRefusedError(111, "Connection refused")).hint or ""
    assert "sandbox" not in hint and "start dockerd" in hint and "DOCKER_HOST" in hint, hint


def test_a_user_outside_the_docker_group_is_told_so_in_one_clear_line() -> None:
    """A lab's new user not in the docker group got "does not answer ... HINT: start dockerd" with the SDK's Python
    tuple in it. Permission denied on the socket, bare (gpupin's own client) or wrapped by requests and urllib3 (the
    SDK's), is said as what it is: the daemon answers, this user may not use its socket."""
    import requests
    import urllib3

    bare = PermissionError(13, "Permission denied")
    wrapped = requests.exceptions.ConnectionError(
        urllib3.exceptions.ProtocolError("Connection aborted.", PermissionError(13, "Permission denied"))
    )
    for err in (bare, wrapped):
        refused = failures.unavailable(err)
        line = refused.line("hostagent")
        assert refused.exit_code == 69 and line.count("\n") == 1, line
        assert "permission denied on its socket" in line and "docker group" in line, line
        assert "start dockerd" not in line and "Errno" not in line, line
        assert "PermissionError" not in line and "Connection aborted" not in line, line
    refused = failures.unavailable(
        requests.exceptions.ConnectionError(
            urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionRefusedError(111, "Connection refused"))
        )
    )
    assert refused.message.endswith("does not answer: [Errno 111] Connection refused"), refused.message
