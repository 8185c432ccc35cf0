"""Which model `check` and `render` read, and how `render` writes the pinned one.

The model: hostagent's own reading of the project (hostagent.compose.project). When the project is more than one
plain file (several files, an override file, `include`, `extends`, `!reset`/`!override`, or profiles that leave
services out) and compose v2 is installed, compose's own `config` is the model instead (hostagent.compose.native):
the real tool's merge, whose output is the file compose itself runs.

What render writes:
- one plain file: that file, edited where the pin changes it and nowhere else (hostagent.compose.roundtrip):
  comments, quoting, anchors and `${VAR}` stay as written;
- a project of several parts: one standard, self-contained compose file, the merged model with every GPU pinned,
  which `docker compose -f OUT up` runs alone (no -f of the sources, no override file: the header says so).
  Variables are already substituted there (a `$` is written `$$`), and relative paths are compose's absolute
  ones when compose v2 built the model.
"""

from __future__ import annotations

import os

from gpupin.hostagent.compose import interpolate, load, native, roundtrip
from gpupin.hostagent.compose.problems import printable
from gpupin.hostagent.compose.project import Options, Project, build

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def read(options: Options) -> Project:
    """The project and the model its commands read (compose v2's where it applies, see above)."""
    project = build(options)
    if project.editable is None:
        cmd = native.command()
        if cmd is not None:
            project.doc = native.config(
                cmd, Options(project.files, options.project_directory, options.env_files, options.profiles)
            )
            project.by_compose = True
    return project


def name(project: Project) -> str:
    """How messages name the project: its file, or its files joined with +."""
    return "+".join(printable(f) for f in project.files)


def written(project: Project, top: str, rendered: dict[str, Any]) -> str:
    """The text render writes: `top` (the header), then the edited file or the merged model."""
    if project.editable is not None:
        source = roundtrip.without_header(project.texts[project.editable])
        return top + "\n" + roundtrip.edit(source, project.doc, rendered)  # the empty line ends the header
    how = "compose v2's `config`" if project.by_compose else "hostagent's reading of compose's rules"
    merged = [
        f"# Merged from {', '.join(printable(os.path.basename(f)) for f in project.files)} by {how}:",
        "# use it alone (-f THIS_FILE), without the source files or an override file.",
    ]
    return top + "\n".join(merged) + "\n\n" + load.dump(interpolate.escaped(rendered))
