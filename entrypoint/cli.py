"""`gpupin-entrypoint [options] [--] CMD...`: the image's ENTRYPOINT.

Verifies that every `cuda:k` the workload will see is the card that was asked for, prints a short mapping to
stderr, and execs CMD (same PID: its exit code and signals are its own). Refuses with exit 78 on a mismatch, 69
when no GPU is usable, 64 on bad usage or a malformed expectation; 127/126 when CMD cannot be run, as Docker does.

The options are parsed by hand: argparse would cost start-up time on every container start, and everything
from the first non-option word on belongs to the workload untouched.
"""

from __future__ import annotations

import os
import sys

from gpupin.entrypoint.errors import GpupinError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpupin.entrypoint.verify import Verification

PROG = "gpupin-entrypoint"
HELP = f"""usage: {PROG} [--verify nvml|cuda|torch] [--require] [--quiet] [--json] [--debug] [--] [CMD [ARG...]]

Prove that every cuda:k this container will see is the physical GPU that was asked for, then exec CMD.

The expectation (which cards, in local-rank order) comes from, in this order:
  GPUPIN_EXPECT            UUID[@BUSID],... as hostagent and `hostagent compose render` write it
  NVIDIA_VISIBLE_DEVICES   when it lists UUIDs (docker --gpus device=UUID, Kubernetes)
  DOCKER_RESOURCE_*        Swarm generic resources naming GPU UUIDs
  SLURM_STEP_GPUS          Slurm's allocation (SLURM_JOB_GPUS in a batch script): minor numbers, in the order of
                           Slurm's CUDA_VISIBLE_DEVICES for this task; refused (78) when the job changed
                           CUDA_VISIBLE_DEVICES to a card outside it (`srun gpupin-entrypoint CMD`)
The workload gets CUDA_DEVICE_ORDER=PCI_BUS_ID and the CUDA_VISIBLE_DEVICES that puts expectation k at cuda:k
(an inherited value that differs is overridden and reported).

options:
  --verify LEVEL  nvml: the expected cards are present, at the expected bus ids (NVML only)
                  cuda: also ask the CUDA driver, under the final environment, what each cuda:k is (default)
                  torch: also ask torch.cuda.get_device_properties in a child process
                  (env: GPUPIN_VERIFY)
  --require       refuse to start when there is no expectation at all (env: GPUPIN_REQUIRE=1)
  --quiet         print nothing on success; a refusal is never quiet (env: GPUPIN_QUIET=1)
  --json          print the report as one JSON object (stdout without CMD, stderr with one)
  --debug         print a traceback with a refusal
  -h, --help      show this help;  --version  print the version

Without CMD, only verify and report. Exit codes: CMD's own once it runs; 78 refused (misaligned or no
expectation with --require); 69 no usable GPU (NVML or CUDA driver); 64 bad usage or a malformed expectation;
127 CMD not found; 126 CMD not executable.
"""

EX_NOTFOUND = 127
EX_NOEXEC = 126


class Options:
    __slots__ = ("cmd", "debug", "help", "json", "level", "quiet", "require", "version")

    def __init__(self) -> None:
        self.level = os.environ.get("GPUPIN_VERIFY", "cuda") or "cuda"
        self.require = os.environ.get("GPUPIN_REQUIRE", "") not in ("", "0", "false", "no")
        self.quiet = os.environ.get("GPUPIN_QUIET", "") not in ("", "0", "false", "no")
        self.json = False
        self.debug = False
        self.help = False
        self.version = False
        self.cmd: list[str] = []


def parse_args(argv: Sequence[str]) -> Options:
    opts = Options()
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
                    raise UsageError("--verify needs a level", "use --verify nvml, cuda or torch")
                value = argv[i]
            opts.level = value
        elif eq:
            raise UsageError(f"option {name} takes no value", f"see `{PROG} --help`")
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
            raise UsageError(f"unknown option {arg}",
                             f"see `{PROG} --help`; put `--` before a command that starts with '-'")
        i += 1
    opts.cmd = list(argv[i:])
    if opts.level not in ("nvml", "cuda", "torch"):
        raise UsageError(f"unknown verification level {opts.level!r}", "use --verify nvml, cuda or torch")
    return opts


def refuse(err: GpupinError) -> None:
    sys.stderr.write(err.line(PROG))


def report_text(ver: Verification) -> str:
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
        lines.append(f"overrode {key}={old} (inherited from the image or caller)")
    lines.extend(ver.notes)
    lines.extend(f"WARNING: {w}" for w in ver.warnings)
    return "".join(f"{PROG}: {line}\n" for line in lines)


def run_workload(cmd: Sequence[str], env: dict[str, str]) -> int:
    """exec CMD in place of this process; return only when that fails (127/126, as Docker does)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], list(cmd), env)
    except FileNotFoundError:
        where = "" if "/" in cmd[0] else f" in PATH={env.get('PATH', os.defpath)}"
        refuse(GpupinError(f"cannot run {cmd[0]!r}: no such file or directory{where}",
                           "check the command's name, or give its full path"))
        return EX_NOTFOUND
    except OSError as err:  # permission denied, a directory, not an executable format
        refuse(GpupinError(f"cannot run {cmd[0]!r}: {err.strerror or err}",
                           "run an executable file (chmod +x, with a #! line), or name its interpreter first"))
        return EX_NOEXEC
    raise AssertionError("unreachable: execvpe returned")


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        opts = parse_args(args)
        if opts.help:
            sys.stdout.write(HELP)
            return 0
        if opts.version:
            from gpupin.entrypoint import __version__

            sys.stdout.write(f"{PROG} {__version__}\n")
            return 0
        from gpupin.entrypoint.verify import verify

        env, ver = verify(os.environ, opts.level, opts.require)
    except GpupinError as err:
        if debug:
            import traceback

            traceback.print_exc()
        refuse(err)
        return err.exit_code
    if opts.json:
        import json

        out = sys.stderr if opts.cmd else sys.stdout
        out.write(json.dumps(ver.to_dict()) + "\n")
    elif not opts.quiet:
        sys.stderr.write(report_text(ver))
    if not opts.cmd:
        return 0
    return run_workload(opts.cmd, env)


if __name__ == "__main__":
    sys.exit(main())
