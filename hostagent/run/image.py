"""The image a run needs: present locally, or pulled first (`--pull missing|never|always`, as docker run), with the
pull's progress shown as a person can follow it: per layer, redrawn in place on a terminal (as docker shows it),
one plain line per layer and state otherwise (a log gets no progress bars). Progress goes to stderr, as docker
run's does; stdout stays the container's.

The Engine streams a pull as JSON events (`POST /images/create`); tests/data holds one recorded from a real pull
(tests/sandbox/record_pull.sh) that the tests replay.
"""

from __future__ import annotations

import os
import sys

from gpupin.core.errors import DockerRefusedError
from gpupin.hostagent import engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, TextIO

    from gpupin.hostagent.run.request import RunRequest


class Progress:
    """Renders the Engine's pull events: on a terminal one line per layer, updated in place; else one line per
    layer and state change."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self.lines: dict[str, int] = {}  # layer id -> its line, counted from the first (terminal only)
        self.states: dict[str, str] = {}  # layer id -> last status written (plain only)

    def feed(self, event: Mapping[str, Any]) -> None:
        if event.get("error") or event.get("errorDetail"):
            detail = event.get("errorDetail") or {}
            raise DockerRefusedError(
                f"the pull failed: {detail.get('message') or event.get('error')}",
                "check the image name and your registry login (`docker login`)",
            )
        status = str(event.get("status") or "")
        layer = event.get("id")
        if not layer:
            self.out.write(status + "\n")
        elif self.tty:
            self._draw(str(layer), f"{layer}: {status} {event.get('progress') or ''}".rstrip())
        elif self.states.get(str(layer)) != status:
            self.states[str(layer)] = status
            self.out.write(f"{layer}: {status}\n")
        self.out.flush()

    def _draw(self, layer: str, line: str) -> None:
        if layer not in self.lines:
            self.lines[layer] = len(self.lines)
            self.out.write(line + "\n")
            return
        up = len(self.lines) - self.lines[layer]
        # Up to the layer's line, clear it, write, and back down (what docker's jsonmessage does).
        self.out.write(f"\x1b[{up}A\r\x1b[2K{line}\r\x1b[{up}B")


def render(events: Iterable[Mapping[str, Any]], out: TextIO | None = None, tty: bool | None = None) -> None:
    stream = sys.stderr if out is None else out
    progress = Progress(stream, _is_terminal(stream) if tty is None else tty)
    for event in events:
        progress.feed(event)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return os.isatty(stream.fileno()) and os.environ.get("TERM") != "dumb"
    except (OSError, ValueError, AttributeError):
        return False


def pull(api: Any, req: RunRequest) -> None:
    """Pull the request's image (a tag defaults to latest), showing progress; DockerRefusedError (125) if not."""
    from docker.utils import parse_repository_tag

    repo, tag = parse_repository_tag(req.image)
    api = engine.sdk_of(api)  # a pull is the SDK's: the registry credentials of the user's Docker config
    platform = req.options.get("platform")
    # The same words whether the daemon refuses the pull (Docker) or reports the failure in its stream (podman).
    failed = f"image {req.image!r} {'could' if req.pull == 'always' else 'not found locally and could'} not be pulled"
    try:
        render(api.pull(repo, tag=tag or "latest", stream=True, decode=True, platform=platform))
    except DockerRefusedError as err:
        raise DockerRefusedError(f"{failed}: {err.message}", err.hint) from None
    except Exception as err:
        reason = engine.refused(err, "pull").message.split(": ", 1)[-1]
        raise DockerRefusedError(
            f"{failed}: {reason}", "check the name, or build/load it first (`docker images` lists what there is)"
        ) from None


def ensure(api: Any, req: RunRequest) -> None:
    """The image is there before anything is created (pulled as --pull says); else DockerRefusedError (125)."""
    if req.pull != "always":
        try:
            api.inspect_image(req.image)
            return
        except Exception as err:
            if not engine.is_not_found(err):
                raise engine.refused(err, f"could not inspect image {req.image}") from None
        if req.pull == "never":
            raise DockerRefusedError(
                f"image {req.image!r} not found locally (--pull never)",
                "build or load it first (`docker images` lists what there is)",
            )
        sys.stderr.write(f"Unable to find image '{req.image}' locally\n")
    pull(api, req)
