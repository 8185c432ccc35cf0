"""The pull's progress rendered from a real Engine pull stream (recorded by tests/sandbox/record_pull.sh from Docker
20.10 pulling a three-layer image from Debian's docker-registry). The missing-image paths on the sandbox:
tests/docker/test_hostagent_image.py."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from gpupin.core.errors import DockerRefusedError
from gpupin.hostagent.run.image import render
from tests.support.host import REPO

STREAM = REPO / "tests" / "data" / "pull-stream-docker-20.10.jsonl"


def events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in STREAM.read_text().splitlines()]


def test_the_recorded_stream_is_a_real_multi_layer_pull() -> None:
    layers = {e["id"] for e in events() if e.get("status") == "Pull complete"}
    assert len(layers) == 3
    assert any(e.get("progressDetail", {}).get("total") for e in events())


def test_without_a_terminal_each_layer_state_is_one_plain_line() -> None:
    out = io.StringIO()
    render(events(), out, tty=False)
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue() and not any("[=" in ln for ln in lines)  # no bars in a log
    layers = sorted({e["id"] for e in events() if e.get("status") == "Pull complete"})
    for layer in layers:
        mine = [ln.split(": ", 1)[1] for ln in lines if ln.startswith(layer + ": ")]
        # every state once, in the order the Engine went through them
        assert mine[0] == "Pulling fs layer" and mine[-1] == "Pull complete"
        assert len(mine) == len(set(mine))
    assert lines[0] == "recorded: Pulling from gpupin/base"
    assert lines[-2].startswith("Digest: sha256:") and lines[-1].startswith("Status: Downloaded newer image")


def _screen(text: str) -> list[str]:
    """Replay cursor-up / clear-line / cursor-down as a terminal would: the final screen, line by line."""
    screen: list[str] = [""]
    row = 0
    for token in re.split(r"(\x1b\[\d+[AB]|\x1b\[2K|\r|\n)", text):
        if not token:
            continue
        if token == "\n":
            row += 1
            if row == len(screen):
                screen.append("")
        elif token == "\r":
            pass
        elif token == "\x1b[2K":
            screen[row] = ""
        elif token.startswith("\x1b["):
            n = int(token[2:-1])
            row = row - n if token.endswith("A") else row + n
        else:
            screen[row] += token
    return [ln for ln in screen if ln]


def test_on_a_terminal_each_layer_keeps_one_line_updated_in_place() -> None:
    out = io.StringIO()
    render(events(), out, tty=True)
    screen = _screen(out.getvalue())
    layer_lines = [ln for ln in screen if re.match(r"[0-9a-f]{12}: ", ln)]
    assert len(layer_lines) == 3  # one per layer, however many progress events came
    assert all(ln.endswith("Pull complete") for ln in layer_lines), screen
    assert screen[-1].startswith("Status: Downloaded newer image")
    # while downloading, the bar was drawn
    assert "Downloading [" in out.getvalue() and "MB" in out.getvalue()


def test_an_error_in_the_stream_is_one_refusal() -> None:
    bad = [
        *events()[:3],
        {
            "errorDetail": {"message": "unauthorized: authentication required"},
            "error": "unauthorized: authentication required",
        },
    ]
    with pytest.raises(DockerRefusedError) as e:
        render(bad, io.StringIO(), tty=False)
    assert e.value.exit_code == 125 and "unauthorized" in e.value.message and "docker login" in (e.value.hint or "")
