#!/usr/bin/env python3
"""Fake nvidia-container-runtime for the simulated GPU host: a runc wrapper, as the real one is.

A Swarm task has no device request, so Docker adds no hook for it; on a GPU node the default runtime is
`nvidia` (nvidia-container-runtime), which on `create` adds nvidia-container-runtime-hook as a prestart hook
to the bundle's config.json and then runs runc with the same arguments. This does the same with the fake hook
that lies beside it (build/fakegpu/bin/), copying the real runtime's rules (nvidia-container-toolkit,
internal/oci/args.go and internal/modifier/stable.go, legacy mode):
- `create` is a subcommand, unless it is the value of `--bundle`/`-b`; the bundle is `--bundle DIR`,
  `--bundle=DIR`, `-b DIR` (any number of dashes), else the working directory;
- the hook is appended as {"path": HOOK, "args": ["nvidia-container-runtime-hook", "prestart"]}, with no env
  of its own (runc then runs it with runc's environment: the node's), unless a prestart hook whose path
  names nvidia-container-runtime-hook is already there (`docker run --gpus` adds one itself);
- every command, modified or not, is forwarded to the first of docker-runc, runc, crun on PATH.
Failures print one line on stderr and exit 1, as the real runtime does, and runc is not run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

HOOK_NAME = "nvidia-container-runtime-hook"
LOW_LEVEL_RUNTIMES = ("docker-runc", "runc", "crun")
PROG = "nvidia-container-runtime"


class RuntimeFailure(Exception):
    """A failure reported as the real runtime reports it."""


def _is_bundle_flag(arg: str) -> bool:
    return arg.startswith("-") and arg.lstrip("-") in ("b", "bundle")


def has_create_subcommand(args: Sequence[str]) -> bool:
    previous_was_bundle = False
    for a in args:
        if not previous_was_bundle and _is_bundle_flag(a):
            previous_was_bundle = True
            continue
        if not previous_was_bundle and a == "create":
            return True
        previous_was_bundle = False
    return False


def bundle_dir(args: Sequence[str]) -> str:
    bundle = ""
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if _is_bundle_flag(flag):
            if eq:
                bundle = value
            elif i + 1 < len(args):
                bundle = args[i + 1]
                i += 1
            else:
                raise RuntimeFailure("error getting bundle dir from args: bundle option requires an argument")
        i += 1
    return bundle or os.getcwd()


def add_hook(spec: dict[str, Any], hook_path: str) -> bool:
    """Appends the prestart hook unless one is there; returns whether the spec changed."""
    hooks = spec.get("hooks")
    if not isinstance(hooks, dict):
        hooks = spec["hooks"] = {}
    prestart = hooks.get("prestart")
    if not isinstance(prestart, list):
        prestart = hooks["prestart"] = []
    if any(isinstance(h, dict) and HOOK_NAME in str(h.get("path", "")) for h in prestart):
        return False
    prestart.append({"path": hook_path, "args": [HOOK_NAME, "prestart"]})
    return True


def modify_bundle(bundle: str, hook_path: str) -> bool:
    path = Path(bundle) / "config.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise RuntimeFailure(f"error loading OCI specification for modification: {path}: {e}") from None
    if not add_hook(spec, hook_path):
        return False
    tmp = path.with_name(f".{path.name}.fakegpu-tmp")
    try:
        tmp.write_text(json.dumps(spec), encoding="utf-8")
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except OSError as e:
        raise RuntimeFailure(f"error writing modified OCI specification: {e}") from None
    return True


def low_level_runtime(path_env: Optional[str]) -> str:
    me = Path(__file__).resolve()
    for name in LOW_LEVEL_RUNTIMES:
        found = shutil.which(name, path=path_env)
        if found and Path(found).resolve() != me:
            return found
    raise RuntimeFailure(f"error constructing low-level runtime: no {', '.join(LOW_LEVEL_RUNTIMES)} on PATH")


def main(argv: Sequence[str]) -> int:
    args = list(argv[1:])
    try:
        if has_create_subcommand(args):
            hook = Path(__file__).resolve().parent / HOOK_NAME
            if not os.access(hook, os.X_OK):
                raise RuntimeFailure(
                    f"could not apply required modification to OCI specification: {hook}: no such executable"
                )
            modify_bundle(bundle_dir(args), str(hook))
        runtime = low_level_runtime(os.environ.get("PATH"))
    except RuntimeFailure as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    os.execv(runtime, [runtime, *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
