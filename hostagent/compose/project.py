"""The compose model as compose v2 builds it from a project's files (`-f`, override file, `include`, `extends`,
variables, the merge, `!reset`/`!override`, profiles), for hosts without compose v2; where it is installed,
hostagent.compose.native asks it instead, and tests/unit/test_compose_project.py holds the two equal. The
rules: docs/compose.md, "Projects". `editable` names the one file render may edit in place.
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

    from gpupin.hostagent.yamlfile import YAMLMapping

DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
OVERRIDE_FILES = (
    "compose.override.yml",
    "compose.override.yaml",
    "docker-compose.override.yml",
    "docker-compose.override.yaml",
)
_AS_MAPPING = {"environment", "labels", "annotations", "sysctls", "args", "extra_hosts"}  # KEY=VALUE lists
_REPLACED = {"command", "entrypoint", "profiles", "test"}


class ProjectOptions:
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
        doc: YAMLMapping,
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
        # service -> the variables its `env_file:` files set (compose v2's model has them in `environment`; the
        # rules read them under it, so that both models give one verdict)
        self.file_env: dict[str, dict[str, str | None]] = {}
        self.read_files: list[str] = list(texts)  # every file read: compose files and env files (-o never one)


def _refuse(message: str, hint: str | None) -> ServiceError:
    return ServiceError(None, message, hint)


def find_files(options: ProjectOptions, environ: Mapping[str, str], cwd: str) -> list[str]:
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


def env_file(path: str, environ: Mapping[str, str], read: list[str] | None = None) -> dict[str, str]:
    """The KEY=VALUE lines of one env file (bounded as a compose file is: gpupin.core.files), or ServiceError
    naming the file; never a byte of its content. `read` collects the files read."""
    if "\0" in path:
        raise _refuse(f"the env file {printable(path)}: the path holds a NUL character", "give the path of a file")
    try:
        found = interpolate.dotenv(load.decode(load.read(path)), environ)
    except ServiceError as err:
        raise _refuse(f"the env file {printable(path)}: {err.message}", err.hint) from None
    if read is not None:
        read.append(path)
    return found


def variables(
    env_files: Sequence[str], folder: str, environ: Mapping[str, str], read: list[str] | None = None
) -> dict[str, str]:
    """The environment over the `.env` file of `folder` (or over `env_files`, in order)."""
    paths = list(env_files) or ([os.path.join(folder, ".env")] if os.path.isfile(os.path.join(folder, ".env")) else [])
    found: dict[str, str] = {}
    for path in paths:
        found.update(env_file(path, {**found, **environ}, read))
    return {**found, **environ}


def _paths(value: Any, where: str, what: str) -> list[Any]:
    """A key that compose takes as one path or a list of them, as a list; ServiceError for another shape."""
    items = [value] if isinstance(value, (str, dict)) else value
    if not isinstance(items, list):
        raise _refuse(
            f"{where}: `{what}` is {quoted(value, 30)}, not a path or a list of paths", f"write {what}: [PATH, ...]"
        )
    return items


def service_env_files(svc: Any, name: Any, folder: str, where: str) -> list[tuple[str, bool]]:
    """A service's `env_file:` entries as (absolute path, required): a path, a list of paths, or of
    {path, required} (compose v2.24 and later), relative to the folder of the file that names them."""
    if not isinstance(svc, dict) or svc.get("env_file") is None:
        return []
    out: list[tuple[str, bool]] = []
    for entry in _paths(svc["env_file"], f"{where}: service {quoted(name)}", "env_file"):
        path, required = (entry.get("path"), entry.get("required", True)) if isinstance(entry, dict) else (entry, True)
        if not isinstance(path, str) or not path or not isinstance(required, bool):
            raise _refuse(
                f"{where}: service {quoted(name)}: an `env_file` entry {quoted(entry, 60)} names no file",
                "write env_file: [PATH, ...] or [{path: PATH, required: false}]",
            )
        out.append((os.path.join(folder, path), required))
    return out


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


class _FileLoader:
    """Loads a project's files: reads files (each once), substitutes variables, follows include and extends."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.texts: dict[str, str] = {}
        self.followed = False  # include or extends met: the model is more than one file as written
        self.marked = False  # !reset or !override met
        self.including: list[str] = []  # the include chain, to refuse a file that includes itself
        self.read: list[str] = []  # env files read
        # (file, service) -> the service's env files there, its `extends` base's first (as compose merges them)
        self.env_files: dict[tuple[str, Any], list[tuple[str, bool]]] = {}
        self.projects: list[str] = []  # the files whose services are the project's (not only an extends base)

    def file(self, path: str, variables: Mapping[str, str]) -> YAMLMapping:
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
        for entry in _paths(doc.pop("include", None) or [], printable(path), "include"):
            self.followed = True
            self.include(doc, entry, folder, path)
        svcs = doc.get("services")
        if isinstance(svcs, dict):
            for name, svc in svcs.items():
                self.env_files[(path, name)] = service_env_files(svc, name, folder, printable(path))
            for name in list(svcs):
                svcs[name] = self.extended(svcs, name, path, variables, [])
        return doc

    def include(self, doc: YAMLMapping, entry: Any, folder: str, path: str) -> None:
        spec = entry if isinstance(entry, dict) else {"path": entry}
        paths = spec.get("path")
        paths = [paths] if isinstance(paths, str) else paths
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise _refuse(f"{printable(path)}: an `include` entry names no file", "write include: [FILE, ...]")
        if any("\0" in p for p in paths):
            raise _refuse(f"{printable(path)}: an `include` path holds a NUL character", "give the path of a file")
        paths = [os.path.join(folder, p) for p in paths]
        real = [os.path.realpath(p) for p in paths]
        if set(real) & set(self.including):
            raise _refuse(
                f"{printable(path)} includes {printable(paths[0])}, which includes it back", "break the include cycle"
            )
        home = spec.get("project_directory")
        if home is not None and not isinstance(home, str):
            raise _refuse(
                f"{printable(path)}: an `include` entry's project_directory is {quoted(home, 30)}, not a path",
                "write project_directory: PATH",
            )
        home = os.path.join(folder, home) if home else os.path.dirname(paths[0])
        env_files = _paths(spec.get("env_file") or [], printable(path), "include.env_file")
        if not all(isinstance(e, str) for e in env_files):
            raise _refuse(
                f"{printable(path)}: an `include` entry's env_file is not a path", "write env_file: [PATH, ...]"
            )
        env_files = [os.path.join(folder, e) for e in env_files]
        self.including.append(os.path.realpath(path))
        sub = self.project(paths, variables(env_files, home, self.environ, self.read))
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
        self, svcs: YAMLMapping, name: str, path: str, variables: Mapping[str, str], chain: list[tuple[str, str]]
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
        inherited = self.env_files.get((base_path, target), [])
        mine = self.env_files.get((path, name), [])
        self.env_files[(path, name)] = inherited + [e for e in mine if e not in inherited]
        return merge(base, own)

    def file_services(self, path: str, variables: Mapping[str, str]) -> YAMLMapping:
        doc = self.file(path, variables)
        svcs = doc.get("services")
        return svcs if isinstance(svcs, dict) else {}

    def project(self, paths: Sequence[str], variables: Mapping[str, str]) -> YAMLMapping:
        doc: YAMLMapping = {}
        self.projects.extend(paths)
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


def active(doc: YAMLMapping, profiles: Sequence[str], environ: Mapping[str, str]) -> bool:
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


def build(options: ProjectOptions, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> Project:
    """The project's model, or ServiceError(None, ...) that says which file and why."""
    environ = os.environ if environ is None else environ
    files = find_files(options, environ, cwd or os.getcwd())
    if cwd is not None:  # files given relative to another folder than this process's
        files = [os.path.join(cwd, f) for f in files]
    home = options.project_directory or os.path.dirname(os.path.abspath(files[0]))
    reader = _FileLoader(environ)
    found = variables(options.env_files, home, environ, reader.read)
    doc = reader.project(files, found)
    dropped = active(doc, options.profiles, environ)
    single = len(files) == 1 and not (reader.followed or reader.marked or dropped)
    if not single and isinstance(doc.get("services"), dict):  # in compose's order (by name), as its model has them
        doc["services"] = dict(sorted(doc["services"].items(), key=lambda kv: str(kv[0])))
    project = Project(doc, files, found, files[0] if single else None, reader.texts)
    project.file_env = service_env(doc, reader, found)
    project.read_files += reader.read
    return project


def service_env(doc: YAMLMapping, reader: _FileLoader, found: Mapping[str, str]) -> dict[str, dict[str, str | None]]:
    """Each service's variables from its `env_file:` files, in order (a later file wins, `environment` over all:
    what compose gives the container). A missing file is refused unless `required: false`, as compose does."""
    out: dict[str, dict[str, str | None]] = {}
    svcs = doc.get("services")
    for name in svcs if isinstance(svcs, dict) else ():
        entries: list[tuple[str, bool]] = []
        for path in dict.fromkeys(reader.projects):
            entries += [e for e in reader.env_files.get((path, name), []) if e not in entries]
        env: dict[str, str | None] = {}
        for path, required in entries:
            if not required and not os.path.exists(path):
                continue
            try:
                env.update(env_file(path, found, reader.read))
            except ServiceError as err:
                raise ServiceError(name, err.message, err.hint) from None
        if env:
            out[str(name)] = env
    return out
