"""A `hostagent run` request and the container it becomes: environment, labels, device request, and the
equivalent `docker run` command line. Pure functions, tested directly (as docker-py tests its payload builders).
"""

from __future__ import annotations

import math
import re
import shlex

from gpupin.entrypoint.errors import UsageError
from gpupin.entrypoint.expectation import EXPECT_VAR
from gpupin.hostagent.ledger import LABEL, SHARED_LABEL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.entrypoint.resolve import Target

# Variables hostagent owns: a request that sets them by hand would defeat the pin.
OWNED_VARS = (EXPECT_VAR, "NVIDIA_VISIBLE_DEVICES")


class RunRequest:
    """What `hostagent run` was asked: the GPUs, the image and command, and the docker run options."""

    def __init__(self, image: str, command: Sequence[str] = (), gpus: Sequence[str] = (), count: int | None = None,
                 name: str | None = None, env: Sequence[str] = (), env_files: Sequence[str] = (),
                 volumes: Sequence[str] = (), rm: bool = False, detach: bool = False, workdir: str | None = None,
                 user: str | None = None, shm_size: str | None = None, ipc: str | None = None,
                 network: str | None = None, labels: Sequence[str] = (), entrypoint: str | None = None,
                 verify: str | None = None, share: bool = False, wait: float | None = None,
                 dry_run: bool = False, pull: str = "missing", stop_timeout: int = 10) -> None:
        self.image = image
        self.command = list(command)
        self.gpus = list(gpus)
        self.count = count
        self.name = name
        self.env = list(env)
        self.env_files = list(env_files)
        self.volumes = list(volumes)
        self.rm = rm
        self.detach = detach
        self.workdir = workdir
        self.user = user
        self.shm_size = shm_size
        self.ipc = ipc
        self.network = network
        self.labels = list(labels)
        self.entrypoint = entrypoint
        self.verify = verify
        self.share = share
        self.wait = wait
        self.dry_run = dry_run
        self.pull = pull
        self.stop_timeout = stop_timeout
        self.validate()

    def validate(self) -> None:
        if not self.image:
            raise UsageError("no image given", "hostagent run [options] IMAGE [CMD...]")
        if bool(self.gpus) == (self.count is not None):
            raise UsageError("say which GPUs: --uuid/--gpu SPEC (one or more), or --count N, not both and not neither",
                             "e.g. hostagent run --uuid GPU-1c5e... IMAGE, or hostagent run --count 1 IMAGE")
        if self.verify is not None and self.verify not in ("nvml", "cuda", "torch"):
            raise UsageError(f"unknown --verify level {self.verify!r}", "use nvml, cuda or torch")
        if self.pull not in ("missing", "never"):
            raise UsageError(f"unknown --pull policy {self.pull!r}", "use missing or never")
        if self.wait is not None and (self.wait < 0 or math.isnan(self.wait)):
            raise UsageError(f"--wait {self.wait}: give a number of seconds >= 0, or no value to wait forever")
        if self.shm_size is not None and not re.fullmatch(r"[0-9]+[bkmgBKMG]?", self.shm_size):
            raise UsageError(f"--shm-size {self.shm_size}: not a size", "give bytes or a size like 256m or 8g")
        for spec in self.labels:
            if not spec.split("=", 1)[0]:
                raise UsageError(f"malformed --label {spec!r}", "use --label key=value")
            if spec.split("=", 1)[0] in (LABEL, SHARED_LABEL):
                raise UsageError(f"--label {spec}: hostagent writes {LABEL} itself (it is the ledger)")


def _read_env_file(path: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """docker's --env-file: KEY=VALUE lines, `#` comments, blank lines; a bare KEY takes this process's value."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as err:
        raise UsageError(f"--env-file {path}: {err.strerror or err}") from None
    out: list[tuple[str, str]] = []
    for n, raw in enumerate(lines, 1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not key or any(c.isspace() for c in key):
            raise UsageError(f"--env-file {path}:{n}: {raw!r} is not KEY=VALUE")
        if eq:
            out.append((key, value))
        elif key in environ:
            out.append((key, environ[key]))
    return out


def environment(req: RunRequest, picks: Sequence[Target], environ: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: --env-file, then -e (as docker orders them), then what pins the GPUs."""
    env: dict[str, str] = {}
    for path in req.env_files:
        env.update(_read_env_file(path, environ))
    for spec in req.env:
        key, eq, value = spec.partition("=")
        if not key:
            raise UsageError(f"malformed -e {spec!r}", "use -e KEY=VALUE, or -e KEY to pass this shell's value")
        if eq:
            env[key] = value
        elif key in environ:
            env[key] = environ[key]
    for key in OWNED_VARS:
        if key in env:
            raise UsageError(f"-e {key}: hostagent sets {key} itself from the GPUs asked",
                             "ask for the GPUs with --uuid/--gpu/--count instead")
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(p.uuid for p in picks)
    env[EXPECT_VAR] = ",".join(p.expect_entry() for p in picks)
    if req.verify:
        env["GPUPIN_VERIFY"] = req.verify
    return env


def labels(req: RunRequest, picks: Sequence[Target]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in req.labels:
        key, _, value = spec.partition("=")
        out[key] = value
    out[LABEL] = ",".join(p.uuid for p in picks)
    if req.share:
        out[SHARED_LABEL] = "true"
    return out


class ContainerSpec:
    """Everything the container is created with, in one place: the API call and the dry-run both read it."""

    def __init__(self, req: RunRequest, picks: Sequence[Target], environ: Mapping[str, str]) -> None:
        self.req = req
        self.picks = list(picks)
        self.env = environment(req, picks, environ)
        self.labels = labels(req, picks)
        self.device_ids = [p.uuid for p in picks]

    def device_request(self) -> dict[str, Any]:
        """The Engine API's DeviceRequest, as `docker run --gpus device=UUID` sends it, but by UUID and naming
        the driver."""
        return {"Driver": "nvidia", "Count": 0, "DeviceIDs": self.device_ids, "Capabilities": [["gpu"]],
                "Options": {}}

    def host_config(self) -> dict[str, Any]:
        """HostConfig fields (the Engine API's names), for the dry run's JSON and for create_host_config."""
        r = self.req
        hc: dict[str, Any] = {"DeviceRequests": [self.device_request()], "AutoRemove": r.rm}
        if r.volumes:
            hc["Binds"] = list(r.volumes)
        if r.shm_size:
            hc["ShmSize"] = r.shm_size
        if r.ipc:
            hc["IpcMode"] = r.ipc
        if r.network:
            hc["NetworkMode"] = r.network
        return hc

    def create_kwargs(self, api: Any) -> dict[str, Any]:
        """Arguments for docker.APIClient.create_container."""
        from docker.types import DeviceRequest

        r = self.req
        host_config = api.create_host_config(
            device_requests=[DeviceRequest(driver="nvidia", device_ids=self.device_ids, capabilities=[["gpu"]])],
            auto_remove=r.rm, binds=r.volumes or None, shm_size=r.shm_size, ipc_mode=r.ipc,
            network_mode=r.network,
        )
        kwargs: dict[str, Any] = {
            "image": r.image, "command": r.command or None, "environment": self.env, "labels": self.labels,
            "host_config": host_config, "name": r.name, "working_dir": r.workdir, "user": r.user,
            "detach": r.detach,
        }
        if r.entrypoint is not None:
            kwargs["entrypoint"] = [r.entrypoint] if r.entrypoint else [""]
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        """The create payload in the Engine API's shape (what --dry-run --json prints)."""
        r = self.req
        out: dict[str, Any] = {"Image": r.image, "Cmd": r.command or None,
                               "Env": [f"{k}={v}" for k, v in self.env.items()], "Labels": self.labels,
                               "HostConfig": self.host_config()}
        if r.name:
            out["name"] = r.name
        if r.workdir:
            out["WorkingDir"] = r.workdir
        if r.user:
            out["User"] = r.user
        if r.entrypoint is not None:
            out["Entrypoint"] = [r.entrypoint]
        return out

    def docker_run_argv(self) -> list[str]:
        """The equivalent `docker run` command line."""
        r = self.req
        argv = ["docker", "run"]
        if r.detach:
            argv.append("-d")
        if r.rm:
            argv.append("--rm")
        if r.name:
            argv += ["--name", r.name]
        # --gpus is CSV: a list of ids must be quoted inside the value, hence the inner double quotes.
        argv += ["--gpus", '"device=' + ",".join(self.device_ids) + '"']
        for key, value in self.env.items():
            argv += ["-e", f"{key}={value}"]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        for v in r.volumes:
            argv += ["-v", v]
        options = (("-w", r.workdir), ("-u", r.user), ("--shm-size", r.shm_size), ("--ipc", r.ipc),
                   ("--network", r.network), ("--entrypoint", r.entrypoint))
        for flag, opt in options:
            if opt is not None:
                argv += [flag, opt]
        return [*argv, r.image, *r.command]

    def docker_run_line(self) -> str:
        return shlex.join(self.docker_run_argv())
