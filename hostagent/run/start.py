"""From a created container to `hostagent run`'s exit code, the same whoever created it (this process, or the
resident agent for it): attach (in the foreground), register the wait, start, then follow or print the ID; a start
that fails removes the container and is refused with `docker run`'s code (125, 126, 127).

Everything here talks to the daemon through the client of its transport (engine.follower: on a unix socket, the
hand-made one): through the agent, `hostagent run` never imports the docker SDK. The lease of a container whose
start takes long is renewed here, by its owner (gpupin.hostagent.ledger.lease.Renewal).
"""

from __future__ import annotations

import contextlib
import signal
import sys

from gpupin.hostagent import engine, mark, say
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.run.attach import Attachment, Follow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.core.errors import DockerRefusedError
    from gpupin.hostagent.engine.unix import UnixClient


class Interrupted(Exception):
    """SIGTERM before the container started (SIGINT is KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def interrupted(err: Interrupted | KeyboardInterrupt) -> int:
    """A signal before the container started: said in one line, and 128+N. Nothing is left behind: a container
    created meanwhile carries this process's lease, so once it ends nothing holds its cards."""
    signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
    say(f"{signal.Signals(signum).name} before the container started: nothing left behind")
    return 128 + signum


def refused(err: BaseException, doing: str, via: str, podman: bool = False) -> DockerRefusedError:
    """The daemon's refusal as `docker run` codes it; a CDI name it does not serve gets the hint that fits (on
    `podman`, which reads its own spec folders and takes no --via nvidia, another)."""
    from gpupin.hostagent.engine import cdi  # its names' rules compile regular expressions: only on a refusal

    out = engine.refused(err, doing)
    if via == cdi.CDI and "cdi" in out.message.lower():
        out.hint = (
            f"podman does not resolve this {cdi.KIND} name: it reads the specs in /etc/cdi and /var/run/cdi "
            "(`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` writes them; `nvidia-ctk cdi list` lists "
            "their names)"
            if podman
            else f"the daemon does not serve {cdi.KIND} by this name: see `docker info` (CDISpecDirs) and the "
            "spec (`nvidia-ctk cdi list` lists its names), or pin with --via nvidia"
        )
    return out


def start(api: UnixClient, cid: str, req: Follow, via: str) -> Attachment | None:
    """Attach (in the foreground) and start; the attachment to follow, or None with -d. Any failure removes the
    container (it holds its cards while its lease is live: nothing is left holding them)."""
    attachment = None
    try:
        # Renewed on the daemon while it starts, however long the NVIDIA hook takes, for the clients that cannot
        # see this process; those that can see it alive leave it alone.
        with lease.Renewal(cid, api.version):
            if not req.detach:
                attachment = Attachment(cid, req, api)
                attachment.open()
                mark("attached")
            api.start(cid)
        mark("started")
        return attachment
    except BaseException as err:
        if attachment is not None:
            attachment.close()
        with contextlib.suppress(Exception):
            api.remove(cid, force=True)
        if engine.is_api_error(err):
            runtime = "podman" if api.podman is not None else "Docker"  # the error names the runtime it came from
            raise refused(err, f"{runtime} could not start the container", via, api.podman is not None) from None
        if isinstance(err, Exception) and engine.is_daemon_failure(err):
            raise engine.failure(err, "starting the container") from None
        raise


def finish(cid: str, attachment: Attachment | None) -> int:
    """The ID with -d; else the container followed to its end, and its exit code."""
    if attachment is None:
        sys.stdout.write(cid + "\n")
        return 0
    return attachment.follow()
