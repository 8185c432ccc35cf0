"""`gpupin-entrypoint [options] [--] CMD...`: the image's ENTRYPOINT (docs/entrypoint.md).

Proves that every `cuda:k` the workload will see is the card asked for, then execs CMD. Options are parsed by
hand: argparse costs start-up time on every container start, and every word from CMD on is the workload's.
No `from __future__ import annotations`: imported before isolation (docs/design.md, Import rules).
"""

import os
import sys

from gpupin.core.contract import (
    DEFAULT_LEVEL,
    LEVELS,
    LEVELS_TEXT,
    OFF,
    ON,
    QUIET_VAR,
    REQUIRE_VAR,
    VERIFY_VAR,
    WATCH_VAR,
)
from gpupin.core.errors import GpupinError, StoppedError, UsageError, shorten, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import FrameType

    from gpupin.entrypoint.verify import Verification

PROG = "gpupin-entrypoint"
HELP = f"""usage: {PROG} [--verify nvml|cuda|torch] [--require] [--watch SECONDS] [--quiet] [--json] [--debug]
                         [--] [CMD [ARG...]]

Prove that every cuda:k this container will see is the physical GPU that was asked for, then exec CMD (with
--watch: run CMD and keep checking the cards while it runs).

The expectation (which cards, in local-rank order) comes from, in this order:
  GPUPIN_EXPECT            UUID[@BUSID],... as hostagent and `hostagent compose render` write it (through
                           CDI too: there NVIDIA_VISIBLE_DEVICES=void names no card)
  /var/run/kubernetes.io/dra-device-attributes   Kubernetes DRA device metadata (KEP-5304): the GPUs of the
                           claims this container references (UUID, bus id or minor number), in bus order
  NVIDIA_VISIBLE_DEVICES   UUIDs (docker --gpus device=UUID, Kubernetes); indices and MIG i:j (--gpus device=1,
                           the device plugin's index strategy) where they can be known, and only when no
                           source below names cards (an index orders the devices, it names no card)
  /var/run/nvidia-container-devices   the Kubernetes device plugin's volume-mounts list (one file per device)
  DOCKER_RESOURCE_*        Swarm generic resources naming GPU UUIDs: the cards the task reserved, so a task
                           that sees more is refused (78: the node's runtime did not read the variable)
  SLURM_STEP_GPUS          Slurm's allocation (SLURM_JOB_GPUS in a batch script): each number is a card's place
                           in the node's gres.conf (read beside $SLURM_CONF; where it cannot be read, the number
                           is taken as the minor number, and the report says so), in the order of Slurm's
                           CUDA_VISIBLE_DEVICES for this task; refused (78) when the job changed
                           CUDA_VISIBLE_DEVICES to a card outside it (`srun gpupin-entrypoint CMD`)
The workload gets CUDA_DEVICE_ORDER=PCI_BUS_ID and the CUDA_VISIBLE_DEVICES that puts expectation k at cuda:k
(an inherited value that differs is overridden and reported).

options:
  --verify LEVEL  nvml: the expected cards are present, at the expected bus ids (NVML only)
                  cuda: also ask the CUDA driver, under the final environment, what each cuda:k is (default)
                  torch: also ask torch.cuda.get_device_properties in a child process
                  (env: GPUPIN_VERIFY)
  --require       refuse to start when there is no expectation at all (env: GPUPIN_REQUIRE=1)
  --watch SECONDS stay as CMD's parent (as tini: signals passed on to its process group, zombies reaped, its exit
                  code passed through) and every SECONDS check that the GPU device nodes still open, that NVML
                  answers and finds each pinned card at its bus id, and that no card turned unhealthy (a critical
                  XID, uncorrectable ECC errors); on a loss, stop CMD (SIGTERM, SIGKILL after GPUPIN_WATCH_GRACE
                  seconds, default 10), say in one line what was lost and which signal stopped CMD, and exit 79
                  (env: GPUPIN_WATCH=SECONDS); one line says which cards it watches when it starts
  --quiet         print nothing on success; a refusal is never quiet (env: GPUPIN_QUIET=1)
  --json          print the report as one JSON object (stdout without CMD, stderr with one)
  --debug         print a traceback with a refusal
  -h, --help      show this help;  --version  print the version
Only the options before CMD are the entrypoint's; everything from CMD on is the workload's, untouched.
GPUPIN_REQUIRE and GPUPIN_QUIET take 1/true/yes/on or 0/false/no/off (empty: off); GPUPIN_PROBE_TIMEOUT is how
long the CUDA and torch probes may take, in seconds (default 120).

Without CMD, only verify and report. Exit codes: CMD's own once it runs; 78 refused (misaligned or no
expectation with --require); 69 no usable GPU (NVML or CUDA driver); 64 bad usage or a malformed expectation;
127 CMD not found; 126 CMD not executable; 128+N stopped by signal N (docker stop: 143) before CMD started;
with --watch, 128+N also when CMD died of signal N, and 79 when a pinned card was lost and CMD was stopped.
The entrypoint's own imports ignore PYTHONPATH, the working directory and the user site, which CMD gets as they
are (see gpupin.entrypoint.isolation for what is and is not guarded).
"""

EX_NOTFOUND = 127
EX_NOEXEC = 126
# What ends the entrypoint while it verifies: docker stop (TERM), Ctrl-C (INT), a closed terminal (HUP). As PID 1
# of a container, it would otherwise ignore them (the kernel drops signals PID 1 has no handler for), and docker
# stop would wait its 10 s for a SIGKILL while the probe runs on.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


class Options:
    """The entrypoint's options: its own command line first, then GPUPIN_* for what the command line left unset."""

    __slots__ = ("cmd", "debug", "grace", "help", "json", "level", "quiet", "require", "version", "watch")

    def __init__(self) -> None:
        self.level: str | None = None
        self.require: bool | None = None
        self.quiet: bool | None = None
        self.json = False
        self.debug = False
        self.help = False
        self.version = False
        self.watch: float | None = None  # seconds between checks; None: exec CMD, no watching
        self.grace = 0.0
        self.cmd: list[str] = []


class CommandError(GpupinError):
    """CMD cannot be run: 127 not found (an empty name too), 126 not executable, as Docker reports them."""

    def __init__(self, exit_code: int, message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


def _level(value: str, given: str, hint: str) -> str:
    level = value.strip().lower()
    if level not in LEVELS:
        raise UsageError(f"unknown verification level {shorten(value)} ({given})", hint)
    return level


def _flag(environ: "Mapping[str, str]", name: str) -> bool:
    raw = environ.get(name, "")
    if raw.strip().lower() in ON:
        return True
    if raw.strip().lower() in OFF:
        return False
    raise UsageError(
        f"{name}={shorten(raw)} is neither on nor off",
        f"set {name}=1 or {name}=0 (true/false, yes/no, on/off), or unset it",
    )


def parse_args(
    argv: "Sequence[str]", opts: "Options | None" = None, environ: "Mapping[str, str] | None" = None
) -> Options:
    """Fill `opts` from the entrypoint's own options (those before CMD), then from GPUPIN_* where none was given.

    `opts` is filled as parsing goes, so a caller that catches a UsageError still knows whether --debug came first.
    """
    opts = Options() if opts is None else opts
    env = os.environ if environ is None else environ
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, eq, value = arg.partition("=")
        if name == "--verify":
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError("--verify needs a level", f"use --verify {LEVELS_TEXT}")
                value = argv[i]
            opts.level = _level(value, "--verify", f"use --verify {LEVELS_TEXT}")
        elif name == "--watch":
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError("--watch needs a number of seconds", "use --watch 5, say")
                value = argv[i]
            from gpupin.entrypoint.watch import interval

            opts.watch = interval(value, "--watch")
        elif eq:
            raise UsageError(f"option {shorten(name)} takes no value", f"see `{PROG} --help`")
        elif arg == "--require":
            opts.require = True
        elif arg in ("--quiet", "-q"):
            opts.quiet = True
        elif arg == "--json":
            opts.json = True
        elif arg == "--debug":
            opts.debug = True
        elif arg in ("-h", "--help"):
            opts.help = True
        elif arg == "--version":
            opts.version = True
        else:
            raise UsageError(
                f"unknown option {shorten(arg)}", f"see `{PROG} --help`; put `--` before a command that starts with '-'"
            )
        i += 1
    opts.cmd = list(argv[i:])
    if opts.help or opts.version:
        return opts
    if opts.level is None:
        raw = env.get(VERIFY_VAR, "")
        opts.level = (
            _level(raw, VERIFY_VAR, f"set {VERIFY_VAR} to {', '.join(LEVELS)}, or unset it for {DEFAULT_LEVEL}")
            if raw.strip()
            else DEFAULT_LEVEL
        )
    if opts.require is None:
        opts.require = _flag(env, REQUIRE_VAR)
    if opts.quiet is None:
        opts.quiet = _flag(env, QUIET_VAR)
    if opts.watch is None and env.get(WATCH_VAR, "").strip():
        from gpupin.entrypoint.watch import interval

        opts.watch = interval(env[WATCH_VAR], WATCH_VAR)
    if opts.watch is not None:
        from gpupin.entrypoint.watch import grace

        opts.grace = grace(env)
    if opts.cmd and not opts.cmd[0]:
        raise CommandError(
            EX_NOTFOUND,
            "cannot run '': the command name is empty",
            "give the command after the options; an empty CMD or ENTRYPOINT entry in the image, "
            "compose file or `docker run` line does this",
        )
    return opts


def refuse(err: GpupinError) -> None:
    sys.stderr.write(err.line(PROG))


def report_text(ver: "Verification") -> str:
    exp = ver.plan.expectation
    lines = []
    head = f"verified at level {ver.level}"
    if exp:
        head += f", expectation from {exp.detail or exp.source}"
    lines.append(head)
    for b in ver.mapping():
        note = b.expected.note if b.expected else None
        rank = note or (f"local rank {b.local_rank}" if exp else "unpinned")
        lines.append(f"  cuda:{b.local_rank}  {b.uuid}  {b.bus_id or '?'}  {b.name or '?'}  ({rank})")
    if exp is None and ver.level == "nvml":
        lines.append("  (nvml level without an expectation: cuda:k not asked; NVML order shown)")
    lines.append("set " + " ".join(f"{k}={v}" for k, v in ver.env_set.items() if k != "GPUPIN_EXPECT"))
    for key, old in ver.overridden.items():
        lines.append(f"overrode {key}={shown(old)} (inherited from the image or caller)")
    lines.extend(ver.notes)
    lines.extend(f"WARNING: {w}" for w in ver.warnings)
    return "".join(f"{PROG}: {line}\n" for line in lines)


def run_workload(cmd: "Sequence[str]", env: "dict[str, str]") -> int:
    """exec CMD in place of this process; raise CommandError (127/126, as Docker does) when that fails."""
    import signal

    # Python ignores these for itself at start-up, and exec would hand that on: `yes | head -1` in CMD would print
    # "Broken pipe". They go back to their default, as subprocess's restore_signals does.
    for num in (signal.SIGPIPE, signal.SIGXFSZ):
        if signal.getsignal(num) is signal.SIG_IGN:
            signal.signal(num, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], list(cmd), env)
    except FileNotFoundError:
        where = "" if "/" in cmd[0] else f" in PATH={shorten(env.get('PATH', os.defpath), 300)}"
        raise CommandError(
            EX_NOTFOUND,
            f"cannot run {shorten(cmd[0])}: no such file or directory{where}",
            "check the command's name, or give its full path",
        ) from None
    except (OSError, ValueError) as err:  # permission denied, a directory, not an executable format; a NUL byte
        why = (err.strerror if isinstance(err, OSError) else None) or err
        raise CommandError(
            EX_NOEXEC,
            f"cannot run {shorten(cmd[0])}: {why}",
            "run an executable file (chmod +x, with a #! line), or name its interpreter first",
        ) from None
    raise AssertionError("unreachable: execvpe returned")


def _stop(signum: int, frame: "FrameType | None") -> None:
    import signal

    raise StoppedError(signum, signal.Signals(signum).name, "verifying the GPU pin")


def end_children() -> None:
    """Kill and reap what this process started and has not reaped: a stop signal that comes while a probe is being
    spawned (after its fork, before subprocess has its handle) leaves a child nothing else would end. Its children
    are read from /proc/self/task/*/children."""
    import os
    import signal
    import time

    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as fh:
                pids.update(int(p) for p in fh.read().split())
    except (OSError, ValueError):  # no /proc, or a kernel without the children file: subprocess's own kill stands
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        deadline = time.monotonic() + 1.0  # a child stuck in the driver may outlive SIGKILL: not waited on forever
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def catch_stop_signals() -> "dict[int, object]":
    """Make STOP_SIGNALS end the entrypoint with 128+N (a probe child is killed on the way out); return the
    handlers to put back. A signal inherited as ignored stays ignored, for this process and, through exec, CMD.
    exec gives CMD the default action for the others."""
    import signal

    previous: dict[int, object] = {}
    for name in STOP_SIGNALS:
        num = getattr(signal, name)
        try:
            if signal.getsignal(num) is not signal.SIG_IGN:
                previous[num] = signal.signal(num, _stop)
        except ValueError:  # not the main thread: signals are the embedding program's business
            break
    return previous


def restore_signals(previous: "dict[int, object]") -> None:
    import signal

    for num, handler in previous.items():
        signal.signal(num, handler)  # type: ignore[arg-type]


def run(argv: "Sequence[str]", opts: Options) -> int:
    parse_args(argv, opts)
    if opts.help:
        sys.stdout.write(HELP)
        return 0
    if opts.version:
        from gpupin.core import __version__

        sys.stdout.write(f"{PROG} {__version__}\n")
        return 0
    from gpupin.entrypoint.verify import verify

    assert opts.level is not None
    env, ver = verify(os.environ, opts.level, bool(opts.require))
    if opts.json:
        import json

        out = sys.stderr if opts.cmd else sys.stdout
        out.write(json.dumps(ver.to_dict()) + "\n")
    elif not opts.quiet:
        sys.stderr.write(report_text(ver))
    if not opts.cmd:
        return 0
    if opts.watch is not None:
        from gpupin.entrypoint.watch import run_watched

        return run_watched(opts.cmd, env, ver, opts.watch, opts.grace, run_workload, PROG, bool(opts.quiet))
    return run_workload(opts.cmd, env)


def main(argv: "Sequence[str] | None" = None) -> int:
    """The console script. Called without `argv` (as the program), it first keeps its own imports away from the
    workload's PYTHONPATH, working directory and user site (gpupin.entrypoint.isolation); called with `argv`, the
    process is the caller's and sys.path is left alone."""
    if argv is None:
        from gpupin.entrypoint.isolation import isolate

        isolate()
        argv = sys.argv[1:]
    opts = Options()
    previous = catch_stop_signals()
    try:
        return run(argv, opts)
    except GpupinError as err:
        if isinstance(err, StoppedError):
            end_children()
        if opts.debug:  # only the entrypoint's own --debug, never one in CMD's arguments
            import traceback

            traceback.print_exc()
        refuse(err)
        return err.exit_code
    finally:
        restore_signals(previous)


if __name__ == "__main__":
    sys.exit(main())
