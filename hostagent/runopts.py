"""The `docker run` options that `hostagent run` takes: one table, read by the parser, the argument splitter, the
create payload and the dry-run line alike, so that an option means the same thing everywhere.

Spellings and meanings are docker run's. Each row says where its value goes in the Engine API (a keyword of the
docker SDK's ContainerConfig or HostConfig, through a conversion where the CLI's text is not the API's value) and
how it is written back as a `docker run` option. Options with a meaning of their own in hostagent (`-e`,
`--env-file`, `--label`, which meet the pin; `--name`, `--pull`, `-d`) are rows too, with no payload keyword: the
request reads them itself.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

FLAG = "flag"  # no value (store_true)
VALUE = "value"  # one value, the last one given wins
APPEND = "append"  # may be given again; values in order


class Option:
    """One docker run option."""

    __slots__ = ("choices", "container", "convert", "dest", "flags", "help", "host", "kind", "metavar")

    def __init__(self, flags: Sequence[str], help: str, kind: str = VALUE, metavar: str | None = None,
                 container: str | None = None, host: str | None = None,
                 convert: Callable[[Any], Any] | None = None, choices: Sequence[str] | None = None,
                 dest: str | None = None) -> None:
        self.flags = tuple(flags)
        self.help = help
        self.kind = kind
        self.metavar = metavar
        self.container = container  # docker.types.ContainerConfig keyword
        self.host = host  # docker.types.HostConfig keyword
        self.convert = convert
        self.choices = tuple(choices) if choices else None
        self.dest = dest or self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def takes_value(self) -> bool:
        return self.kind != FLAG

    def sdk_value(self, value: Any) -> Any:
        return self.convert(value) if self.convert is not None else value

    def docker_args(self, value: Any) -> list[str]:
        """This option as `docker run` arguments (nothing when unset)."""
        if self.kind == FLAG:
            return [self.flags[0]] if value else []
        values = value if self.kind == APPEND else ([] if value is None else [value])
        return [a for v in values for a in (self.flags[0], str(v))]


def _entrypoint(value: str) -> list[str]:
    # docker run: --entrypoint names one executable (never split on spaces); an empty one resets the image's.
    return [value]


OPTIONS: Sequence[Option] = (
    Option(("--name",), "assign a name to the container"),
    Option(("-d", "--detach"), "run in the background and print the container ID", FLAG),
    Option(("--rm",), "remove the container when it exits", FLAG, host="auto_remove"),
    Option(("-e", "--env"), "set an environment variable (KEY=VALUE, or KEY to pass this shell's value)", APPEND,
           "KEY[=VALUE]"),
    Option(("--env-file",), "read environment variables from a file (KEY=VALUE lines)", APPEND, "FILE",
           dest="env_files"),
    Option(("--label",), "set a label on the container", APPEND, "KEY=VALUE", dest="labels"),
    Option(("-v", "--volume"), "bind mount a volume", APPEND, "SRC:DST[:OPTS]", host="binds",
           dest="volumes"),
    Option(("-w", "--workdir"), "working directory inside the container", container="working_dir",
           metavar="DIR"),
    Option(("-u", "--user"), "username or UID (format: <name|uid>[:<group|gid>])", container="user"),
    Option(("--entrypoint",), "override the image's ENTRYPOINT (the pin is proven only by gpupin-entrypoint)",
           container="entrypoint", convert=_entrypoint, metavar="CMD"),
    Option(("--shm-size",), "size of /dev/shm (e.g. 8g)", host="shm_size", metavar="SIZE"),
    Option(("--ipc",), "IPC mode to use (e.g. host)", host="ipc_mode", metavar="MODE"),
    Option(("--network",), "connect the container to a network", host="network_mode", metavar="NETWORK"),
    Option(("--pull",), "pull the image before running: missing (default) or never", choices=("missing", "never"),
           metavar="POLICY"),
    Option(("--stop-timeout",), "seconds to wait for the container to stop (after Ctrl-C or SIGTERM too) before "
           "killing it (default 10)", container="stop_timeout", convert=int, metavar="SECONDS"),
)

BY_FLAG = {flag: opt for opt in OPTIONS for flag in opt.flags}
BY_DEST = {opt.dest: opt for opt in OPTIONS}
