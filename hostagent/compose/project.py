"""The compose model as compose v2 builds it from a project's files, for hosts without compose v2 (where it is
installed, hostagent.compose.native asks it instead, and tests/unit/test_compose_project.py shows the two agree).

    files      `-f` given (in order), else COMPOSE_FILE, else the first of compose.yaml, compose.yml,
               docker-compose.yml, docker-compose.yaml in the folder or the nearest one above it, with the first
               of compose.override.yml, compose.override.yaml, docker-compose.override.yml, .yaml beside it
    variables  the environment over `.env` in the project folder (or the `--env-file` files), in every value
               (hostagent.compose.interpolate)
    per file   `include:` (each a project of its own, its services added; a name defined twice is refused), then
               `extends:` (same file, or `file:`), each service merged over the one it extends
    merged     each file over the ones before it: mappings key by key, `environment`/`labels` (and the other
               KEY=VALUE lists) entry by entry, lists appended, `command`, `entrypoint`, `profiles` and `x-` keys
               replaced; `!reset` drops a key, `!override` replaces it
    profiles   a service with `profiles:` only when one of them is active (`--profile`, COMPOSE_PROFILES)

The project folder is `--project-directory`, else the first file's folder. A merged model lists its services by
name, as compose's does (counts are placed in that order). `editable` names the one file
`render` may edit in place (hostagent.compose.roundtrip) when the model is that file and nothing else.
"""

from __future__ import annotations

import os

from gpupin.hostagent.compose import interpolate, load
from gpupin.hostagent.compose.load import RESET, Override
from gpupin.hostagent.compose.problems import ServiceError, printable, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
OVERRIDE_FILES = (
    "compose.override.yml",
    "compose.override.yaml",
    "docker-compose.override.yml",
    "docker-compose.override.yaml",
)
_AS_MAPPING = {"environment", "labels", "annotations", "sysctls", "args", "extra_hosts"}  # KEY=VALUE lists
_REPLACED = {"command", "entrypoint", "profiles", "test"}


class Options:
    """What the command line says about the project (as `docker compose` takes it)."""

    def __init__(
        self,
        files: Sequence[str] = (),
        project_directory: str | None = None,
        env_files: Sequence[str] = (),
        profiles: Sequence[str] = (),
    ) -> None:
        self.files = list(files)
        self.project_directory = project_directory
        self.env_files = list(env_files)
        self.profiles = list(profiles)


class Project:
    """The model (a plain compose document), the files it came from and the variables it was read with."""

    def __init__(
        self,
        doc: dict[str, Any],
        files: list[str],
        variables: dict[str, str],
        editable: str | None,
        texts: dict[str, str],
    ) -> None:
        self.doc = doc
        self.files = files
        self.variables = variables
        self.editable = editable
        self.texts = texts  # file -> the text read (the editable file's is what render edits)
        self.by_compose = False  # the model is compose v2's `config` (hostagent.compose.command.read_model)


def _refuse(message: str, hint: str | None) -> ServiceError:
    return ServiceError(None, message, hint)


def find_files(options: Options, environ: Mapping[str, str], cwd: str) -> list[str]:
    """The project's files, as compose finds them."""
    if options.files:
        return options.files
    if environ.get("COMPOSE_FILE"):
        sep = environ.get("COMPOSE_PATH_SEPARATOR", os.pathsep)
        return [f for f in environ["COMPOSE_FILE"].split(sep) if f]
    folder = os.path.abspath(options.project_directory or cwd)
    while True:
        found = next((os.path.join(folder, n) for n in DEFAULT_FILES if os.path.isfile(os.path.join(folder, n))), None)
        if found:
            override = next(
                (os.path.join(folder, n) for n in OVERRIDE_FILES if os.path.isfile(os.path.join(folder, n))), None
            )
            return [found] + ([override] if override else [])
        parent = os.path.dirname(folder)
        if parent == folder:
            raise _refuse(
                f"no compose file here ({', '.join(DEFAULT_FILES)}), nor in a folder above",
                "give it: hostagent compose render FILE (or -f FILE, several times)",
            )
        folder = parent


def variables(env_files: Sequence[str], folder: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment over the `.env` file of `folder` (or over `env_files`, in order)."""
    paths = list(env_files) or ([os.path.join(folder, ".env")] if os.path.isfile(os.path.join(folder, ".env")) else [])
    found: dict[str, str] = {}
    for path in paths:
        try:
            text = load.decode(load.read(path))
        except ServiceError as err:
            raise _refuse(f"the env file {printable(path)}: {err.message}", err.hint) from None
        found.update(interpolate.dotenv(text, {**found, **environ}))
    return {**found, **environ}


def clean(value: Any) -> Any:
    """A tree without !reset and !override marks (what they mean in the first file: nothing to reset)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not RESET}
    if isinstance(value, list):
        return [clean(v) for v in value if v is not RESET]
    if isinstance(value, Override):
        return clean(value.value)
    return value


def as_mapping(value: Any) -> dict[Any, Any] | None:
    """A KEY=VALUE list (`environment`, `labels`...) or mapping as a mapping (KEY alone: None); else None."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        out: dict[Any, Any] = {}
        for entry in value:
            key, sep, val = entry.partition("=")
            out[key] = val if sep else None
        return out
    return None


def merge(base: Any, over: Any, key: str = "") -> Any:
    """`over` merged over `base`, as compose merges a file over the ones before it (and a service over the one
    it extends)."""
    if over is RESET:
        return None
    if isinstance(over, Override):
        return clean(over.value)
    if key in _REPLACED or key.startswith("x-"):
        return clean(over)
    if key in _AS_MAPPING:
        a, b = as_mapping(base), as_mapping(clean(over))
        if a is not None and b is not None:
            return {**a, **b}
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is RESET:
                out.pop(k, None)
            else:
                out[k] = merge(out[k], v, str(k)) if k in out else clean(v)
        return out
    if isinstance(base, list) and isinstance(over, list):
        extra = [x for x in clean(over) if x not in base]
        return base + extra
    return clean(over)


class _Reader:
    """Reads files (each once), substitutes variables, follows include and extends."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.texts: dict[str, str] = {}
        self.followed = False  # include or extends met: the model is more than one file as written
        self.marked = False  # !reset or !override met
        self.including: list[str] = []  # the include chain, to refuse a file that includes itself

    def file(self, path: str, variables: Mapping[str, str]) -> dict[str, Any]:
        try:
            text = load.decode(load.read(path))
            doc = load.parse(text)
        except ServiceError as err:
            if err.service is None and len(self.texts) > 0:
                raise _refuse(f"{printable(path)}: {err.message}", err.hint) from None
            raise
        self.texts[path] = text
        if not isinstance(doc, dict):
            raise _refuse(
                f"{printable(path)} is not a compose file (its top level is not a mapping)",
                "a compose file is a mapping with a `services:` key",
            )
        if _has_marks(doc):
            self.marked = True
        doc = interpolate.tree(doc, variables)
        assert isinstance(doc, dict)
        folder = os.path.dirname(os.path.abspath(path))
        for entry in doc.pop("include", None) or []:
            self.followed = True
            self.include(doc, entry, folder, path)
        svcs = doc.get("services")
        if isinstance(svcs, dict):
            for name in list(svcs):
                svcs[name] = self.extended(svcs, name, path, variables, [])
        return doc

    def include(self, doc: dict[str, Any], entry: Any, folder: str, path: str) -> None:
        spec = entry if isinstance(entry, dict) else {"path": entry}
        paths = spec.get("path")
        paths = [paths] if isinstance(paths, str) else paths
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise _refuse(f"{printable(path)}: an `include` entry names no file", "write include: [FILE, ...]")
        paths = [os.path.join(folder, p) for p in paths]
        real = [os.path.realpath(p) for p in paths]
        if set(real) & set(self.including):
            raise _refuse(
                f"{printable(path)} includes {printable(paths[0])}, which includes it back", "break the include cycle"
            )
        home = (
            os.path.join(folder, spec["project_directory"])
            if spec.get("project_directory")
            else os.path.dirname(paths[0])
        )
        env_files = spec.get("env_file") or []
        env_files = [os.path.join(folder, e) for e in ([env_files] if isinstance(env_files, str) else env_files)]
        self.including.append(os.path.realpath(path))
        sub = self.project(paths, variables(env_files, home, self.environ))
        self.including.pop()
        for top in ("services", "networks", "volumes", "configs", "secrets"):
            for name, item in (sub.get(top) or {}).items():
                mine = doc.setdefault(top, {})
                if not isinstance(mine, dict):
                    continue
                if name in mine and top == "services":
                    raise _refuse(
                        f"the service {quoted(name)} is defined by {printable(path)} and by the file it "
                        f"includes ({printable(paths[0])})",
                        "rename one of them",
                    )
                mine.setdefault(name, item)

    def extended(
        self, svcs: dict[str, Any], name: str, path: str, variables: Mapping[str, str], chain: list[tuple[str, str]]
    ) -> Any:
        svc = svcs[name]
        if not isinstance(svc, dict) or "extends" not in svc:
            return svc
        self.followed = True
        ext = svc["extends"]
        ext = {"service": ext} if isinstance(ext, str) else ext
        if not isinstance(ext, dict) or not isinstance(ext.get("service"), str):
            raise _refuse(f"service {quoted(name)}: `extends` names no service", "write extends: {service: NAME}")
        if (path, name) in chain:
            raise _refuse(
                f"service {quoted(name)} extends itself (through {', '.join(n for _, n in chain)})", "break the cycle"
            )
        other, base_path = svcs, path
        if ext.get("file"):
            base_path = os.path.join(os.path.dirname(os.path.abspath(path)), str(ext["file"]))
            other = self.file_services(base_path, variables)
        target = ext["service"]
        if target not in other:
            raise _refuse(
                f"service {quoted(name)} extends {quoted(target)}, which {printable(base_path)} does not define",
                "name a service of that file",
            )
        base = self.extended(other, target, base_path, variables, [*chain, (path, name)])
        own = {k: v for k, v in svc.items() if k != "extends"}
        return merge(base, own)

    def file_services(self, path: str, variables: Mapping[str, str]) -> dict[str, Any]:
        doc = self.file(path, variables)
        svcs = doc.get("services")
        return svcs if isinstance(svcs, dict) else {}

    def project(self, paths: Sequence[str], variables: Mapping[str, str]) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for i, path in enumerate(paths):
            one = self.file(path, variables)
            merged = clean(one) if i == 0 else merge(doc, one)
            doc = merged if isinstance(merged, dict) else {}
        return doc


def _has_marks(value: Any) -> bool:
    if value is RESET or isinstance(value, Override):
        return True
    if isinstance(value, dict):
        return any(_has_marks(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_marks(v) for v in value)
    return False


def active(doc: dict[str, Any], profiles: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Drop the services of profiles that are not active; True when one was dropped."""
    on = set(profiles) | {p for p in environ.get("COMPOSE_PROFILES", "").split(",") if p}
    svcs = doc.get("services")
    if not isinstance(svcs, dict) or "*" in on:
        return False
    off = [
        n
        for n, s in svcs.items()
        if isinstance(s, dict) and isinstance(s.get("profiles"), list) and not on & {str(p) for p in s["profiles"]}
    ]
    for name in off:
        del svcs[name]
    return bool(off)


def build(options: Options, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> Project:
    """The project's model, or ServiceError(None, ...) that says which file and why."""
    environ = os.environ if environ is None else environ
    files = find_files(options, environ, cwd or os.getcwd())
    if cwd is not None:  # files given relative to another folder than this process's
        files = [os.path.join(cwd, f) for f in files]
    home = options.project_directory or os.path.dirname(os.path.abspath(files[0]))
    found = variables(options.env_files, home, environ)
    reader = _Reader(environ)
    doc = reader.project(files, found)
    dropped = active(doc, options.profiles, environ)
    single = len(files) == 1 and not (reader.followed or reader.marked or dropped)
    if not single and isinstance(doc.get("services"), dict):  # in compose's order (by name), as its model has them
        doc["services"] = dict(sorted(doc["services"].items(), key=lambda kv: str(kv[0])))
    return Project(doc, files, found, files[0] if single else None, reader.texts)
