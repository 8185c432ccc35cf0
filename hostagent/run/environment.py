"""The container's environment as the user gives it to `hostagent run`: --env-file, then -e, merged as docker merges
them (seen the same in Docker 20.10 and Engine 26), and each variable's origin, so that `--dry-run` can say where
a value came from instead of printing it: it may be a secret (docs/run.md, "--dry-run").
"""

from __future__ import annotations

from gpupin.core.contract import picks_devices
from gpupin.core.errors import UsageError, shown
from gpupin.hostagent.pin import OWNED_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

FROM_ENVIRON = "the environment"


class EnvVar:
    """One variable: its value (None: `-e KEY` with KEY unset, passed on bare), the env file it came from (None:
    -e), and whether its value was read from this process's environment (`-e KEY`, or a bare KEY in a file).
    A value (equal by its fields, iterable as them); not a typing.NamedTuple, whose import costs every run ~3 ms."""

    __slots__ = ("file", "key", "passed", "value")

    def __init__(self, key: str, value: str | None, file: str | None = None, passed: bool = False) -> None:
        self.key = key
        self.value = value
        self.file = file
        self.passed = passed

    def _fields(self) -> tuple[str, str | None, str | None, bool]:
        return (self.key, self.value, self.file, self.passed)

    def __iter__(self) -> Iterator[str | bool | None]:
        return iter(self._fields())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EnvVar) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "EnvVar({!r}, {!r}, {!r}, {!r})".format(*self._fields())

    def entry(self) -> str:
        """As the Engine API's Env list holds it."""
        return self.key if self.value is None else f"{self.key}={self.value}"

    def shown(self) -> str:
        """As a dry run shows it: a value from a file or from the environment redacted."""
        if self.value is not None and (self.file is not None or self.passed):
            return f"{self.key}=<redacted from {self.file or FROM_ENVIRON}>"
        return self.entry()


ENV_FILE_LIMIT = 1 << 20  # bytes, as for a compose file: far beyond any real environment


def read_env_file(path: str, environ: Mapping[str, str]) -> list[EnvVar]:
    """docker's --env-file: KEY=VALUE lines (the value as is, to the line's end), `#` comments, blank lines; a bare
    KEY takes this process's value, or is dropped when unset."""
    from gpupin.hostagent.run.reads import read_file

    try:
        data = read_file(path, ENV_FILE_LIMIT)
    except OSError as err:
        raise UsageError(
            f"--env-file {shown(path)}: {err.strerror or err}", "give the path of a KEY=VALUE file"
        ) from None
    out: list[EnvVar] = []
    for n, raw_bytes in enumerate(data.splitlines(), 1):
        try:
            raw = raw_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"--env-file {shown(path)}:{n}: not UTF-8 text", "save the file as UTF-8") from None
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not key or any(c.isspace() for c in key):
            raise UsageError(f"--env-file {shown(path)}:{n}: the line is not KEY=VALUE", "one KEY=VALUE per line")
        if eq:
            out.append(EnvVar(key, value, path))
        elif key in environ:
            out.append(EnvVar(key, environ[key], path, passed=True))
    return out


def user_environment(env_files: Sequence[str], env: Sequence[str], environ: Mapping[str, str]) -> list[EnvVar]:
    """--env-file, then -e, as docker merges them; the variables the pin owns are refused."""
    out = [var for path in env_files for var in read_env_file(path, environ)]
    given: dict[str, EnvVar] = {}
    for spec in env:
        key, eq, value = spec.partition("=")
        if not key:
            raise UsageError(f"malformed -e {spec!r}", "use -e KEY=VALUE, or -e KEY to pass this shell's value")
        if eq:
            given[key] = EnvVar(key, value)
        else:
            given[key] = EnvVar(key, environ.get(key), passed=key in environ)
    out += given.values()
    for var in out:
        _owned(var)
    return out


def _owned(var: EnvVar) -> None:
    """Refuse a variable that the pin owns or that the NVIDIA toolkit reads to pick devices, naming where it was
    given."""
    where = f"--env-file {shown(var.file)}: {shown(var.key)}" if var.file is not None else f"-e {shown(var.key)}"
    if var.key in OWNED_VARS:
        raise UsageError(
            f"{where}: hostagent sets {var.key} itself from the GPUs asked",
            "ask for the GPUs with --uuid/--gpu/--count instead",
        )
    if picks_devices(var.key):
        raise UsageError(
            f"{where}: the NVIDIA runtime reads {var.key} to pick the devices it exposes, which would "
            f"give the container devices outside its pin ({shown(var.entry())})",
            "ask for the GPUs with --uuid/--gpu/--count; hostagent exposes exactly those",
        )
