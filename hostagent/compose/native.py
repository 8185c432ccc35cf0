"""compose v2's own model of a project: `docker compose config`, the real tool's view of the files, taken for a
project of more than one plain file so that what is checked and pinned is what `docker compose up` runs. Its
YAML is read: compose 2.26's JSON drops a service's `x-` keys. GPUPIN_COMPOSE names the binary, or `none`
(docs/compose.md, "Projects").
"""

from __future__ import annotations

import os
import shutil
import subprocess

from gpupin.hostagent.compose import interpolate, load
from gpupin.hostagent.compose.problems import ServiceError, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpupin.hostagent.compose.project import ProjectOptions
    from gpupin.hostagent.yamlfile import YAMLMapping

ENV = "GPUPIN_COMPOSE"
TIMEOUT = 60


def command(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """How to run compose v2 here (`docker compose`, or a standalone v2 binary), or None."""
    environ = os.environ if environ is None else environ
    given = environ.get(ENV, "")
    if given == "none":
        return None
    if given:
        cmd = [given, "compose"] if os.path.basename(given) == "docker" else [given]
    else:
        docker = shutil.which("docker")
        if docker is None:
            return None
        cmd = [docker, "compose"]
    try:
        r = subprocess.run(
            [*cmd, "version", "--short"], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = r.stdout.strip().lstrip("v")
    return cmd if r.returncode == 0 and version[:2] == "2." else None


def arguments(options: ProjectOptions) -> list[str]:
    args: list[str] = []
    if options.project_directory:
        args += ["--project-directory", options.project_directory]
    for f in options.files:
        args += ["-f", f]
    for e in options.env_files:
        args += ["--env-file", e]
    for p in options.profiles:
        args += ["--profile", p]
    return args


def config(cmd: list[str], options: ProjectOptions, cwd: str | None = None) -> YAMLMapping:
    """compose's model of the project, or ServiceError(None, ...) with compose's own reason."""
    try:
        r = subprocess.run(
            [*cmd, *arguments(options), "config"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ServiceError(
            None,
            f"`{' '.join(printable(c) for c in cmd)} config` did not answer ({err})",
            f"set {ENV}=none to use hostagent's own reading of the files",
        ) from None
    if r.returncode != 0:
        why = " ".join(r.stderr.split())[:500] or f"exit {r.returncode}"
        raise ServiceError(
            None,
            f"compose refuses the project: {printable(why)}",
            "fix what compose names (`docker compose config` shows it)",
        )
    doc = interpolate.unescaped(load.parse(r.stdout))  # substituted, each literal $ written $$
    if not isinstance(doc, dict):
        raise ServiceError(None, "`docker compose config` printed no model", f"set {ENV}=none")
    return doc
