"""A `hostagent run` request and the container it becomes.

`RunRequest` is what was asked (the GPUs, the image and command untouched, the docker run options of
gpupin.hostagent.run.options), checked before any I/O. `ContainerSpec` is the container: its environment and
labels (the user's, then the pin's, gpupin.hostagent.pin), and one create payload built with the docker SDK's own
types (ContainerConfig, HostConfig), which both the create call and `--dry-run --json` use; `--dry-run` also
prints the equivalent `docker run` line from the same table of options.
"""

from __future__ import annotations

import math
import os
import re
import shlex

from gpupin.core.contract import LABEL, LEVELS_TEXT
from gpupin.core.contract import LEVELS as VERIFY_LEVELS
from gpupin.core.errors import UsageError
from gpupin.hostagent.ledger.booking import FOR_LABEL
from gpupin.hostagent.ledger.booking import LABEL as BOOKING_LABEL
from gpupin.hostagent.pin import OWNED_LABELS, Pin, check_via
from gpupin.hostagent.run import options as runopts
from gpupin.hostagent.run import reads as runreads
from gpupin.hostagent.run import values
from gpupin.hostagent.run.environment import EnvVar, user_environment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.core.resolve import Target

# An image reference as the Engine reads it: [registry[:port]/]path[:tag][@digest], lower-case path components.
_REFERENCE = re.compile(
    r"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def bad_option(err: BaseException) -> UsageError:
    """An option value the docker SDK refuses (it checks some itself: sizes, modes), when building the payload or
    creating the container."""
    return UsageError(f"bad option: {err}", "see `hostagent run --help`")


def _default(opt: runopts.Option) -> Any:
    return [] if opt.kind == runopts.APPEND else None


class RunRequest:
    """What `hostagent run` was asked: the GPUs, the image and command, and the docker run options."""

    def __init__(
        self,
        image: str,
        command: Sequence[str] = (),
        gpus: Sequence[str] = (),
        count: int | None = None,
        share: bool = False,
        wait: float | None = None,
        book_for: float | None = None,
        verify: str | None = None,
        dry_run: bool = False,
        via: str | None = None,
        environ: Mapping[str, str] | None = None,
        max_load: float | None = None,
        max_memory: float | None = None,
        reads: runreads.Reads | None = None,
        **options: Any,
    ) -> None:
        self.image = image
        self.command = list(command)  # everything after IMAGE, untouched (as docker run passes it)
        self.gpus = list(gpus)
        self.count = count
        self.share = share
        self.wait = wait
        self.book_for = book_for  # --for, seconds; None: the policy's default (docs/policy.md)
        self.verify = verify
        self.dry_run = dry_run
        self.via = via  # cdi or nvidia as asked (--via); None: as the daemon serves (gpupin.hostagent.engine.cdi)
        # --count's limits (percent): a card other processes use is taken when it is loaded no more than this.
        self.max_load = max_load
        self.max_memory = max_memory
        unknown = set(options) - set(runopts.BY_DEST)
        if unknown:
            raise TypeError(f"unknown docker run option(s): {', '.join(sorted(unknown))}")
        self.options: dict[str, Any] = {o.dest: options.get(o.dest, _default(o)) for o in runopts.OPTIONS}
        # What the options read (the current folder, the files they name): kept, for the agent that builds the
        # container from the same options (gpupin.hostagent.run.request_json), or the caller's, in that agent.
        self.reads = runreads.Reads() if reads is None else reads
        token = runreads.reads.set(self.reads)
        try:
            self.validate()
            # The user's part of the environment (--env-file, then -e), read now: a bad file is refused before
            # NVML or Docker is asked anything.
            self.user_env = user_environment(
                self.options["env_files"], self.options["env"], os.environ if environ is None else environ
            )
        finally:
            runreads.reads.reset(token)

    # The options hostagent itself acts on.
    @property
    def name(self) -> str | None:
        return self.options["name"]  # type: ignore[no-any-return]

    @property
    def rm(self) -> bool:
        return bool(self.options["rm"])

    @property
    def detach(self) -> bool:
        return bool(self.options["detach"])

    @property
    def pull(self) -> str:
        return self.options["pull"] or "missing"

    @property
    def stop_timeout(self) -> int | None:
        value = self.options["stop_timeout"]
        return None if value is None else int(value)

    @property
    def interactive(self) -> bool:
        return bool(self.options["interactive"])

    @property
    def tty(self) -> bool:
        return bool(self.options["tty"])

    @property
    def sig_proxy(self) -> bool:
        return self.options["sig_proxy"] is not False  # a bool flag that is on unless given =false, as docker's

    def validate(self) -> None:
        """Every check that needs no I/O, so that a bad request is refused before NVML or Docker is asked; then
        the options' conversions (themselves checks): files (a seccomp profile) and the current folder (`-v
        ./data:/data`) are read once, by the caller, with the caller's rights (`reads`; in the resident agent, what
        the caller sent)."""
        self.check()
        self.payload = runopts.payload(self.options)

    def check(self) -> None:
        """The checks of what was asked that read nothing."""
        if not self.image:
            raise UsageError(
                "no IMAGE given", "hostagent run [OPTIONS] IMAGE [COMMAND [ARG...]]; see `hostagent run --help`"
            )
        if self.image.startswith("-"):
            raise UsageError(
                f"IMAGE {self.image!r} begins with '-': options go before IMAGE, and hostagent run "
                "does not pass options it does not know on to Docker",
                "see `hostagent run --help` for the options it takes",
            )
        if not _REFERENCE.fullmatch(self.image):
            raise UsageError(
                f"{self.image!r} is not a valid image reference",
                "write it as docker does: [REGISTRY/]NAME[:TAG][@DIGEST], lower-case name",
            )
        if bool(self.gpus) == (self.count is not None):
            raise UsageError(
                "say which GPUs: --uuid/--gpu SPEC (one or more), or --count N, not both and not neither",
                "e.g. hostagent run --uuid GPU-1c5e... IMAGE, or hostagent run --count 1 IMAGE",
            )
        if self.count is not None and self.count < 1:
            raise UsageError(f"--count {self.count}: ask for at least one card")
        for flag, limit in (("--max-load", self.max_load), ("--max-memory", self.max_memory)):
            if limit is None:
                continue
            if self.count is None:
                raise UsageError(
                    f"{flag} goes with --count: it says how loaded a card that other processes use may be to be chosen",
                    "to use a named card that others use, add --share",
                )
            if not 0 <= limit <= 100:  # NaN fails both
                raise UsageError(f"{flag} {limit:g}: give a percentage from 0 to 100", f"e.g. {flag} 50 (GPUtil's 0.5)")
        if self.verify is not None and self.verify not in VERIFY_LEVELS:
            raise UsageError(f"unknown --verify level {self.verify!r}", f"use {LEVELS_TEXT}")
        if self.wait is not None and (self.wait < 0 or math.isnan(self.wait)):
            raise UsageError(f"--wait {self.wait}: give a number of seconds >= 0, or no value to wait forever")
        self.capabilities = values.gpu_capabilities(self.options["gpu_capabilities"])
        if self.via is not None:
            check_via(self.via, self.capabilities)
        restart = self.options["restart"]
        if self.rm and restart not in (None, "no"):
            raise UsageError(
                f"--rm and --restart {restart} conflict: a container removed when it exits cannot be restarted",
                "drop one of them",
            )
        for spec in self.options["labels"]:
            key = spec.split("=", 1)[0]
            if not key:
                raise UsageError(f"malformed --label {spec!r}", "use --label key=value")
            if key in (BOOKING_LABEL, FOR_LABEL):  # a run's booking is --for, judged for the caller
                raise UsageError(
                    f"--label {spec}: hostagent writes {key} itself (who booked the cards, and until when)",
                    "remove it; --for DURATION sets the end",
                )
            if key in OWNED_LABELS:
                raise UsageError(
                    f"--label {spec}: hostagent writes {key} itself ({LABEL} is the ledger)",
                    "remove it; --share sets gpupin.shared",
                )


def labels(req: RunRequest, pin: Pin) -> dict[str, str]:
    out = dict(spec.partition("=")[::2] for spec in req.options["labels"])
    out.update(pin.labels())
    return out


class ContainerSpec:
    """Everything the container is created with, in one place: the create call and the dry run both read it."""

    def __init__(self, req: RunRequest, targets: Sequence[Target], via: str) -> None:
        self.req = req
        self.targets = list(targets)
        self.pin = Pin(targets, share=req.share, verify=req.verify, capabilities=req.capabilities, via=via)
        self.env = [*req.user_env, *(EnvVar(k, v) for k, v in self.pin.env().items())]
        self.labels = labels(req, self.pin)

    def config(self, version: str, redact: bool = False) -> JSONObject:
        """The create payload (`POST /containers/create`'s body: gpupin.hostagent.run.body, the SDK's types' dict
        without the SDK); a bad option value is a UsageError. `redact`: the values read from env files and the
        environment hidden (hostagent.run.environment), for showing. `version`: the API version it is sent in (every
        field here is older than MIN_API)."""
        from gpupin.hostagent.run import body

        r = self.req
        import copy  # here, not on the path of a run through the agent, which never builds the payload

        kw = copy.deepcopy(r.payload)
        try:
            host = body.host_config(device_requests=[self.pin.device_request()], **kw[runopts.HOST])
            host.update(kw[runopts.RAW_HOST])
            for key, value in runopts.CLI_HOST_DEFAULTS.items():
                host.setdefault(key, copy.deepcopy(value))
            return body.container_config(
                r.image,
                r.command or None,
                host,
                environment=[v.shown() if redact else v.entry() for v in self.env],
                labels=self.labels,
                detach=r.detach,
                **kw[runopts.CONTAINER],
            )
        except (body.BodyError, ValueError, TypeError) as err:
            raise bad_option(err) from None

    def create_args(self) -> JSONObject:
        """The create call's own arguments beside the payload (name, platform)."""
        return {"name": self.req.name, **self.req.payload[runopts.CREATE]}

    def to_dict(self, version: str) -> JSONObject:
        """What --dry-run --json prints: the create payload, and the create call's other arguments."""
        return {**self.create_args(), "config": self.config(version, redact=True)}

    def docker_run_argv(self) -> list[str]:
        """The equivalent `docker run` command line, option by option from the same table."""
        r = self.req
        argv = ["docker", "run"]
        for opt in runopts.OPTIONS:
            if opt.dest in ("env", "env_files", "labels", "gpu_capabilities"):
                continue  # written below, merged with the pin's
            argv += opt.docker_args(r.options[opt.dest])
        argv += self.pin.docker_run_args()
        argv += [a for path in r.options["env_files"] for a in ("--env-file", path)]
        for var in self.env:
            if var.file is None:  # -e's; a value from the environment as `-e KEY`, which passes it again
                argv += ["-e", var.key if var.passed else var.entry()]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        return [*argv, r.image, *r.command]

    def docker_run_line(self) -> str:
        return shlex.join(self.docker_run_argv())
