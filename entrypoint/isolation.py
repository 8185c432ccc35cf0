"""The entrypoint's own imports come from the installation, never from the workload's paths.

PYTHONPATH, the working directory and the user site belong to the workload, which gets them untouched: the
environment passed to CMD is not changed. But Python puts those places in *this* process's sys.path too, ahead of the
standard library and site-packages, so a workload's `json.py`, `subprocess.py`, an old `pynvml.py` or its own
`entrypoint.py` would be what the entrypoint imports next, and the check would run someone else's code (or die with
a traceback). `isolate()` runs first in `gpupin-entrypoint`'s main(): it takes those entries out of sys.path and
forgets any module already loaded from them, so everything imported afterwards (pynvml, json, subprocess, signal,
ctypes, re, the rest of gpupin.entrypoint) comes from the standard library, site-packages and the place gpupin itself
was installed. The CUDA probe child runs with `python -I -S` (no PYTHONPATH, no site, no working directory) anyway.

What is guarded: every import after main() starts; modules loaded from the workload's paths before it (by a
`sitecustomize.py` there, say) are dropped and loaded again from the installation.

What cannot be guarded, because it runs before any code of gpupin does: Python's own start-up (a `sitecustomize.py`
or `usercustomize.py` on those paths, `.pth` files in the user site, an `encodings` package), what the console-script
wrapper imports (pip before 23.1 writes `import re` into it), and the `gpupin` package itself: a regular package
named `gpupin` (with an `__init__.py`) earlier on PYTHONPATH than site-packages, or anywhere in the user site,
replaces gpupin before this module exists. A `gpupin/` folder without `__init__.py` cannot: the installed
gpupin.entrypoint, a regular package, wins over it. (An editable install, `pip install -e`, is the exception: its
finder is asked after sys.path, so there such a folder does join gpupin.entrypoint.)

Where gpupin itself lives is always kept, even when that is a PYTHONPATH entry or the user site (`pip install
--target DIR` with PYTHONPATH=DIR, `pip install --user`): its dependencies, nvidia-ml-py among them, were installed
beside it. The standard library and the interpreter's site-packages are kept even when PYTHONPATH names them too.

Its own imports are `os` and `sys` only, both loaded before any path is searched.
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
