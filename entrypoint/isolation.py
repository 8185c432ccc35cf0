"""The entrypoint's own imports come from the installation, never from the workload's paths.

PYTHONPATH, the working directory and the user site are the workload's, but Python puts them ahead of the
standard library in *this* process's sys.path too: a workload's `json.py` or old `pynvml.py` would run as the
check. `isolate()`, first in main(), takes those entries out and forgets modules loaded from them. It imports
only `os` and `sys`. What it cannot guard: docs/entrypoint.md, "The workload's paths do not reach the entrypoint".
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def _key(entry: str, cwd: str) -> str:
    # As the import system reads an entry: relative to the working directory ('' is the working directory).
    return os.path.normpath(os.path.join(cwd, entry))


def _entry_of(name: str, file: str) -> str:
    """The sys.path entry a module was found under: its file, less one folder per dotted part (and __init__)."""
    path = os.path.dirname(file)
    depth = name.count(".") + (1 if os.path.basename(file).startswith("__init__.") else 0)
    for _ in range(depth):
        path = os.path.dirname(path)
    return path


def workload_entries(environ: "Mapping[str, str]", cwd: str) -> "set[str]":
    """The sys.path entries the workload's environment decides: PYTHONPATH (an empty element is the working
    directory), the working directory, the script's directory (sys.path[0], unless -I or -P kept it out) and the
    user site."""
    found = {_key(p, cwd) for p in environ.get("PYTHONPATH", "").split(os.pathsep)} | {cwd}
    if sys.path and not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
        found.add(_key(sys.path[0], cwd))
    site = sys.modules.get("site")
    user_site = getattr(site, "USER_SITE", None)
    if isinstance(user_site, str):
        found.add(_key(user_site, cwd))
    return found


def installation_entries(cwd: str) -> "set[str]":
    """What is kept whatever the environment says: where gpupin is installed, the standard library, site-packages."""
    here = os.path.dirname(os.path.abspath(__file__))  # <entry>/gpupin/entrypoint
    keep = {os.path.dirname(os.path.dirname(here)), _stdlib()}
    site = sys.modules.get("site")
    getsitepackages = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        keep.update(getsitepackages())
    return {_key(p, cwd) for p in keep}


def _stdlib() -> str:
    return os.path.dirname(getattr(os, "__file__", None) or os.path.join(sys.base_prefix, "lib", "os.py"))


def isolate(environ: "Mapping[str, str]" = os.environ) -> "list[str]":
    """Take the workload's entries out of sys.path and forget modules loaded from them; return what was taken."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: no entry can be read relative to it
        cwd = "/nonexistent-working-directory"
    drop = workload_entries(environ, cwd) - installation_entries(cwd)
    stdlib = _key(_stdlib(), cwd) + os.sep  # lib-dynload and the like, under the standard library
    kept: list[str] = []
    dropped: list[str] = []
    for entry in sys.path:
        key = _key(entry, cwd) if isinstance(entry, str) else ""
        if key in drop and not key.startswith(stdlib):
            dropped.append(entry)
        else:
            kept.append(entry)
    if not dropped:
        return dropped
    sys.path[:] = kept
    gone = {_key(e, cwd) for e in dropped}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or name == "gpupin" or name.startswith("gpupin.") or not isinstance(file, str):
            continue
        if _key(_entry_of(name, file), cwd) in gone:
            del sys.modules[name]
    return dropped
