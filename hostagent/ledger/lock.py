"""The ledger lock: "look, then create" is mutually exclusive among every client of one Docker daemon, whatever
address reached it. The lock is a container named `gpupin-ledger-lock`, never started and signed with a lease;
a local flock queues the clients of one machine in the kernel; the resident agent takes it by renaming a standby
lock of its own (StandbyLocks). It is let go once the container exists, before the slow start (docs/design.md,
"The lock").
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import re
import stat
import threading
import time

from gpupin.core.contract import LOCK_LABEL as LOCK_LABEL
from gpupin.core.errors import CardHeldError, DockerRefusedError, GpupinError
from gpupin.hostagent import engine, say, start_thread
from gpupin.hostagent.ledger import lease

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer


LOCK_NAME = "gpupin-ledger-lock"
SPARE_IMAGE = "gpupin-ledger-lock:empty"  # an image with no files: what the agent's spares are made from
WAIT_S = 2 * lease.LEASE_S  # how long a run waits for the lock before it gives up (75)
CHECK_S = 0.5  # how often a waiting client looks at who holds the lock


class LeaseLost(Exception):
    """This client ran past its lease inside the critical section: someone may have broken its lock."""


class ImageMissing(Exception):
    """The lock's create found no such image: the caller pulls it (or refuses the run), then takes the lock."""


class LockBusyError(CardHeldError):
    """Another client held the ledger lock for longer than a run waits (exit 75)."""


# --- the local fast path ---------------------------------------------------------------------------------------


def _private_dir(path: str) -> int | None:
    """An fd of `path` when it is a directory (not a link) that this user owns and no one else can write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def _lock_dir() -> int | None:
    chosen = os.environ.get("GPUPIN_LOCK_DIR")
    if chosen:
        return _private_dir(chosen)
    if os.geteuid() == 0:
        try:
            os.mkdir("/run/gpupin", 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        return _private_dir("/run/gpupin")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return _private_dir(runtime) if runtime else None


class LocalLock:
    """An flock on `<private dir>/gpupin-ledger-<key>.lock`; the kernel drops it when its holder dies."""

    def __init__(self, key: str) -> None:
        # The key as it is, made a file name (no hashlib: 2 ms of import on the run path): readable in `ls`.
        self.name = "gpupin-ledger-" + re.sub(r"[^A-Za-z0-9.]+", "-", key)[:160] + ".lock"
        self._fd: int | None = None

    def _open(self) -> int | None:
        if os.environ.get("GPUPIN_LOCAL_LOCK", "1") == "0":
            return None
        dfd = _lock_dir()
        if dfd is None:
            return None
        try:
            fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(fd)
            return None
        return fd

    def acquire(self, timeout: float) -> bool:
        """Whether it was taken within `timeout`; False (never an error) when it is unavailable or busy."""
        fd = self._open()
        if fd is None:
            return False
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() > deadline:
                    os.close(fd)
                    return False
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.02)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


# --- the daemon's lock -----------------------------------------------------------------------------------------


class DaemonLock:
    """The lock container on the daemon (see the module's docstring)."""

    def __init__(self, api: Any, image: str, spares: StandbyLocks | None = None) -> None:
        self.api = api
        self.image = image
        self.image_checked = False  # True once the caller made sure that the image is there
        self.id: str | None = None
        self.sent = 0.0  # when this client sent the create that took it (time.monotonic)
        self.spares = spares
        self.made_from = image  # the lock container's image: the run's, or a spare's (SPARE_IMAGE)

    def _create(self) -> str | None:
        """The new lock's ID, or None when someone holds it."""
        try:
            return _make(self.api, self.image, LOCK_NAME)
        except Exception as err:
            if engine.is_conflict(err):
                return None
            if engine.is_not_found(err) and not self.image_checked:
                raise ImageMissing(self.image) from None
            if not engine.is_daemon_failure(err):
                raise
            raise engine.failure(err, f"could not take the ledger lock ({LOCK_NAME}) from image {self.image}") from None

    def _look(self) -> tuple[str, DaemonAnswer | None]:
        """Who holds it: (lease state, or "gone" or "squatted", and its inspect data)."""
        try:
            info, now = engine.fetch(self.api, f"/containers/{LOCK_NAME}/json")
        except engine.EngineNotFound:
            return "gone", None
        labels = (info.get("Config") or {}).get("Labels") or {}
        if LOCK_LABEL not in labels:
            return "squatted", info
        return lease.state(
            labels, engine.created_time(str(info.get("Created"))), now or time.time(), owner_alive_holds=False
        ), info

    def _break(self, lock_id: str) -> None:
        try:
            self.api.remove_container(lock_id, force=True, v=True)
        except Exception as err:
            if not (engine.is_not_found(err) or engine.is_conflict(err)):  # gone, or being removed by another
                if not engine.is_daemon_failure(err):
                    raise
                raise engine.failure(err, f"could not break the stale ledger lock {lock_id[:12]}") from None

    def acquire(self, deadline: float) -> None:
        spare = self.spares.take() if self.spares is not None else None
        if self.spares is not None and spare is not None:
            if _rename(self.api, spare.id, LOCK_NAME):  # the run's image is checked by its create
                self.id, self.sent, self.made_from = spare.id, spare.sent, spare.image
                return
            self.spares.discard(spare)  # someone holds the lock (or the spare is gone): the usual way
        delay = 0.005
        checked = -CHECK_S
        held_by = "another client"
        while True:
            sent = time.monotonic()
            lock_id = self._create()
            if lock_id is not None:
                self.id, self.sent, self.made_from = lock_id, sent, self.image
                return
            if time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                verdict, info = self._look()
                if verdict == "gone":
                    continue
                assert info is not None
                labels = (info.get("Config") or {}).get("Labels") or {}
                if verdict == "squatted":
                    raise DockerRefusedError(
                        f"the name {LOCK_NAME} is taken by container {str(info.get('Id'))[:12]}, which is not "
                        "hostagent's ledger lock",
                        f"remove or rename it (docker rm {LOCK_NAME})",
                    )
                if verdict in (lease.DEAD, lease.EXPIRED):
                    self._break(str(info["Id"]))
                    continue
                held_by = f"{lease.holder_of(labels)} (lock {str(info.get('Id'))[:12]})"
            if time.monotonic() >= deadline:
                raise LockBusyError(
                    f"the ledger lock ({LOCK_NAME}) on {engine.docker_host()} is still held by {held_by}",
                    "retry, or wait with --wait; a lock whose holder died on this host is broken at once, "
                    f"any other once its lease ({lease.LEASE_S} s) is up",
                )
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.1)

    def release(self, api: Any = None) -> None:
        """Remove the lock by its ID (through `api` when given: a client of the releasing thread's own); with
        spares, rename it to a spare's name while it is young, else remove it and make a new spare."""
        lock_id, self.id = self.id, None
        if lock_id is None:
            return
        if self.spares is not None:
            self.spares.after(api or self.api, StandbyLock(lock_id, self.made_from, self.sent))
            return
        try:
            (api or self.api).remove_container(lock_id, force=True, v=True)
        except Exception as err:
            if not engine.is_not_found(err):  # 404: broken by another, after this client's lease
                say(
                    f"could not remove the ledger lock {lock_id[:12]} ({engine.failure(err, 'remove').message}): "
                    f"other clients wait until its lease ({lease.LEASE_S} s) is up"
                )


def _make(api: Any, image: str, name: str) -> str:
    """A lock container (or a spare): never started, signed with this process's lease."""
    return str(
        api.create_container(
            image,
            entrypoint=["gpupin-ledger-lock"],
            name=name,
            labels={LOCK_LABEL: "ledger", **lease.claim()},
            host_config=api.create_host_config(network_mode="none"),
        )["Id"]
    )


def _rename(api: Any, cid: str, name: str) -> bool:
    """Whether the container now has `name` (False: the name is taken, or the container is gone)."""
    try:
        api.rename(cid, name)
        return True
    except Exception as err:
        if engine.is_conflict(err) or engine.is_not_found(err):
            return False
        if not engine.is_daemon_failure(err):
            raise
        raise engine.failure(err, f"could not rename {cid[:12]} to {name}") from None


def _remove(api: Any, cid: str) -> None:
    """Remove a spare (gone already, or being removed: fine; a failure costs only its name until the next look
    removes it as the dead agent's, or its lease ends)."""
    try:
        api.remove_container(cid, force=True, v=True)
    except Exception as err:
        if not (engine.is_not_found(err) or engine.is_conflict(err) or engine.is_daemon_failure(err)):
            raise


class StandbyLock:
    """A lock container not named as the lock: made by this process at `sent` (time.monotonic), for `image`."""

    __slots__ = ("id", "image", "sent")

    def __init__(self, cid: str, image: str, sent: float) -> None:
        self.id = cid
        self.image = image
        self.sent = sent


class StandbyLocks:
    """The resident agent's next ledger lock, made ahead (see the module's docstring): one at a time, for the
    image of its last run, removed once it is no longer young and when the agent stops."""

    # A lock taken through a spare this old keeps 3/4 of its lease for the ledger read and the create.
    FRESH_S = lease.LEASE_S / 4

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._spare: StandbyLock | None = None
        self._timer: threading.Timer | None = None
        self._version: str | None = None
        self._closed = False
        self._taken = -self.FRESH_S  # when a run last took a spare (time.monotonic)

    def take(self) -> StandbyLock | None:
        with self._mutex:
            spare = self._spare
            if spare is None or time.monotonic() - spare.sent > self.FRESH_S:
                return None
            self._spare = None
            self._taken = time.monotonic()
            return spare

    def discard(self, spare: StandbyLock) -> None:
        start_thread(self._remove_later, "hostagent-spare", (spare,))

    def after(self, api: Any, used: StandbyLock) -> None:
        """Let the lock `used` go (once the run's answer is sent): renamed to a spare's name when it was a spare
        and is still young, else removed and a new spare made. A spare that grows old waiting is replaced when it
        does (`_expire`), not after a run: the daemon's create then falls in no run's start."""
        self._version = api.api_version
        young = time.monotonic() - used.sent < self.FRESH_S
        if not self._closed and used.image == SPARE_IMAGE and young:
            try:
                if _rename(api, used.id, _spare_name()):
                    self._keep(used)
                    return
            except GpupinError:  # the daemon failed it: removed below, or left to its lease
                pass
        _remove(api, used.id)
        self._renew(api)

    def _renew(self, api: Any) -> None:
        """A new spare, kept (none when the agent stops, or the daemon fails: the next run takes the lock by a
        create)."""
        if self._closed:
            return
        sent = time.monotonic()
        try:
            try:
                made = StandbyLock(_make(api, SPARE_IMAGE, _spare_name()), SPARE_IMAGE, sent)
            except Exception as err:
                if not engine.is_not_found(err):
                    raise
                # Its image, once per daemon (again after a prune): an empty archive, no layer of substance.
                repository, _, tag = SPARE_IMAGE.partition(":")
                api.import_image_from_data(bytes(1024), repository=repository, tag=tag)
                sent = time.monotonic()
                made = StandbyLock(_make(api, SPARE_IMAGE, _spare_name()), SPARE_IMAGE, sent)
        except Exception as err:
            if not engine.is_daemon_failure(err):
                raise
            return
        self._keep(made)

    def _keep(self, spare: StandbyLock) -> None:
        with self._mutex:
            old, self._spare = self._spare, spare
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(max(0.0, spare.sent + self.FRESH_S - time.monotonic()), self._expire)
            self._timer.daemon = True
            self._timer.start()
            closed = self._closed
        if old is not None:
            self._remove_later(old)
        if closed:
            self.close()

    def _expire(self) -> None:
        """The spare is no longer young: removed, and replaced while runs come (one took a spare within FRESH_S);
        an agent left idle keeps none, and its next run takes the lock by a create."""
        with self._mutex:
            spare = self._spare
            if spare is None or time.monotonic() - spare.sent <= self.FRESH_S:
                return
            self._spare = None
            busy = time.monotonic() - self._taken < self.FRESH_S
        api = engine.connect(version=self._version)
        try:
            if busy:
                self._renew(api)
            _remove(api, spare.id)
        except Exception as err:  # on the timer's thread: said, never raised (the lease ends what is left)
            if not engine.is_daemon_failure(err):
                say(f"internal error while renewing the ledger lock's spare: {type(err).__name__}: {err}")
        finally:
            api.close()

    def _remove_later(self, spare: StandbyLock) -> None:
        api = engine.connect(version=self._version)
        try:
            _remove(api, spare.id)
        finally:
            api.close()

    def close(self) -> None:
        """The agent stops: its spare goes (a spare of an agent that died is removed by the next look)."""
        with self._mutex:
            self._closed = True
            spare, self._spare = self._spare, None
            if self._timer is not None:
                self._timer.cancel()
        if spare is not None:
            self._remove_later(spare)


def _spare_name() -> str:
    return f"gpupin-ledger-spare-{os.getpid()}-{random.getrandbits(32):08x}"


# --- both, around one look-then-create -------------------------------------------------------------------------


class LedgerLock:
    """The local fast path, then the daemon's lock; `with` takes both and lets both go; `check` and `commit`
    keep this client inside its lease."""

    def __init__(
        self,
        api: Any,
        image: str,
        wait_s: float = WAIT_S,
        missing_image: Callable[[], None] | None = None,
        spares: StandbyLocks | None = None,
        after: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.local = LocalLock(engine.endpoint().lock_key())
        self.daemon = DaemonLock(api, image, spares)
        self.wait_s = wait_s
        # The lock's create doubles as the check that the image is there (a round trip saved on every run); when
        # it is not, this is called (pull it, or refuse) outside both locks, once.
        self.missing_image = missing_image
        self.daemon.image_checked = missing_image is None
        # Who lets the lock go once the container is made, instead of a thread of its own: the resident agent, on
        # the request's thread and client once its answer is sent (gpupin.hostagent.serve.runs). A thread of this
        # process's would take the interpreter's lock from the answer (~5 ms, a switch interval).
        self.after = after
        self._handed = False
        self._released: threading.Thread | None = None

    def __enter__(self) -> LedgerLock:
        self._handed = False
        if self._released is not None:
            self._released.join()
            self._released = None
        while True:
            deadline = time.monotonic() + self.wait_s
            # Only a fast path: when it is not taken (unavailable, a frozen holder), the daemon's lock alone decides.
            self.local.acquire(timeout=min(self.wait_s, lease.LEASE_S))
            try:
                self.daemon.acquire(deadline)
                return self
            except ImageMissing:
                self._release()
                assert self.missing_image is not None
                self.missing_image()
                self.daemon.image_checked = True
            except BaseException:
                self._release()
                raise

    def elapsed(self) -> float:
        return time.monotonic() - self.daemon.sent

    def check(self) -> None:
        """Before the create: half the lease is left, so that the create lands well inside it."""
        if self.elapsed() > lease.LEASE_S / 2:
            raise LeaseLost(f"the ledger read took {self.elapsed():.0f} s of a {lease.LEASE_S} s lease")

    def commit(self, cid: str) -> None:
        """After the create: the container was made inside the lease, so every later look sees it (its own lease
        makes it hold until it is started). Then let the lock go, in the background: the start need not wait."""
        if self.elapsed() > lease.LEASE_S:
            raise LeaseLost(f"the create ended {self.elapsed():.0f} s into a {lease.LEASE_S} s lease")
        if self.after is not None:
            self._handed = True
            self.after(self._release)
            return
        # Not a daemon thread: the interpreter waits for it at exit, so a detached run leaves no lock behind. Its
        # own client, made there: the main thread goes on with attach and start on this one.
        self._released = start_thread(self._release, "hostagent-unlock", (self.daemon.api.api_version,), daemon=False)

    def _release(self, version: str | None = None) -> None:
        api = engine.connect(version=version) if version is not None else None
        try:
            self.daemon.release(api)  # failures are said, not raised: the lease ends a lock left behind
        finally:
            self.local.release()
            if api is not None:
                api.close()

    def __exit__(self, *exc: object) -> None:
        if self._released is None and not self._handed:
            self._release()
