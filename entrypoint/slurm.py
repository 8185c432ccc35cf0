"""Slurm's GPU allocation as the expectation: SLURM_STEP_GPUS / SLURM_JOB_GPUS, in CUDA_VISIBLE_DEVICES' order.

Imported only when a SLURM_*_GPUS variable is present (gpupin.entrypoint.sources). What Slurm writes into a task's
environment (gres/gpu, src/plugins/gres/common/gres_common.c; measured on Debian's slurm-wlm 22.05.8 by
tests/test_slurm.py and docs/slurm.md):

- SLURM_STEP_GPUS (a step's tasks, srun) or SLURM_JOB_GPUS (the batch script, salloc's shell): the allocated
  GPUs, ascending, each as its position among gres.conf's gpu `File=` records. With the usual
  `File=/dev/nvidia[0-N]` that position is the device file's minor number, which is how it is read here (NVML's
  minor number, the N of /dev/nvidiaN; never the NVML index, which follows the PCI bus).
- CUDA_VISIBLE_DEVICES: the same numbers in the same order; with ConstrainDevices=yes (task/cgroup) it is 0..n-1
  instead, positions in the allocation, and the task can open only the allocated cards.
- --gpus-per-task (or --gpu-bind): each task's own SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES name its cards only.
- Never CUDA_DEVICE_ORDER: CUDA then numbers FASTEST_FIRST, so `cuda:k` is Slurm's k-th card only by luck.

So the cards are the allocated minor numbers, resolved through NVML, in the order CUDA_VISIBLE_DEVICES gives this
task. A CUDA_VISIBLE_DEVICES that names a card outside the allocation was changed after Slurm set it (a job script,
a launcher): that is refused (exit 78), naming the local rank, the minor numbers and both values.
"""

from __future__ import annotations

from gpupin.entrypoint.errors import ExpectationError, GpuSpecError, MisalignedError
from gpupin.entrypoint.expectation import Expectation, ExpectedCard
from gpupin.entrypoint.identity import is_uuid_like
from gpupin.entrypoint.resolve import Target, by_minor, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpupin.entrypoint.nvml import Card
    from gpupin.entrypoint.sources import Answer, Context

STEP_VAR = "SLURM_STEP_GPUS"
JOB_VAR = "SLURM_JOB_GPUS"
CVD = "CUDA_VISIBLE_DEVICES"
_HINT_CHANGED = (f"something in the job (its script, a launcher) changed {CVD} after Slurm set it: leave it to "
                 "Slurm and start the workload as `srun ... gpupin-entrypoint CMD`, which gives cuda:k = the k-th "
                 "allocated card")


def local_rank(env: Mapping[str, str]) -> str:
    """Slurm's name for this task on its node (SLURM_LOCALID), for messages."""
    rank = env.get("SLURM_LOCALID")
    return f"Slurm local rank {rank}" if rank is not None else "the Slurm job"


def _numbers(var: str, value: str) -> list[int]:
    entries = [e.strip() for e in value.split(",")]
    if not all(e.isascii() and e.isdigit() for e in entries):
        raise ExpectationError(f"{var}={value!r} is not a comma-separated list of GPU numbers",
                               f"Slurm writes {var} itself: check the job for a script that sets it")
    numbers = [int(e) for e in entries]
    if len(set(numbers)) != len(numbers):
        raise ExpectationError(f"{var}={value!r} lists a GPU twice",
                               f"Slurm writes {var} itself: check the job for a script that sets it")
    return numbers


def _minors(cards: Sequence[Card]) -> str:
    return ", ".join(f"/dev/nvidia{c.minor_number} = {c.uuid}" for c in cards if c.minor_number is not None) or "none"


def _describe_number(n: int, cards: Sequence[Card]) -> str:
    card = next((c for c in cards if c.minor_number == n), None)
    return f"/dev/nvidia{n} ({card.uuid} at {card.bus_id})" if card else f"/dev/nvidia{n}, which is not here"


def _order(numbers: list[int], cvd: str | None, allocated: list[Target], cards: Sequence[Card],
           refuse: str) -> list[int]:
    """Positions in the allocation, in the order CUDA_VISIBLE_DEVICES gives them; MisalignedError when it names
    anything outside the allocation. `refuse` is the refusal's opening words (rank, allocation)."""
    if cvd is None:  # unset after Slurm set it: the allocation's own order
        return list(range(len(numbers)))
    entries = [e.strip() for e in cvd.split(",")]
    if entries == [str(n) for n in numbers]:  # Slurm's own value (ConstrainDevices off)
        return list(range(len(numbers)))
    said = f"{CVD}={cvd}"
    if not cvd.strip():
        raise MisalignedError(f"{refuse}, but {said} hides every card", _HINT_CHANGED)
    # Local numbering (0..n-1 into the allocation) is Slurm's under ConstrainDevices, and a container runtime's:
    # then the task can see no card beyond the allocation. Where it can, the numbers are Slurm's own.
    digits = [int(e) for e in entries if e.isascii() and e.isdigit()]
    local = all(c.minor_number in numbers for c in cards) and all(v < len(numbers) for v in digits)
    positions: list[int] = []
    for entry in entries:
        if entry.isascii() and entry.isdigit():
            v = int(entry)
            if local:
                positions.append(v)
            elif v in numbers:
                positions.append(numbers.index(v))
            else:
                raise MisalignedError(f"{refuse}, but {said} names {_describe_number(v, cards)}, outside the "
                                      "allocation", _HINT_CHANGED)
        elif is_uuid_like(entry):  # a launcher's UUIDs (or Slurm's own with gres.conf Flags=env_uuid)
            try:
                target = resolve(entry, cards)
            except GpuSpecError as err:
                raise MisalignedError(f"{refuse}, but {said}: {err.message}", _HINT_CHANGED) from None
            if target not in allocated:
                raise MisalignedError(f"{refuse}, but {said} names {target.uuid} (/dev/nvidia"
                                      f"{target.card.minor_number}), outside the allocation", _HINT_CHANGED)
            positions.append(allocated.index(target))
        else:
            raise MisalignedError(f"{refuse}, but {said}: {entry!r} names no card", _HINT_CHANGED)
    if len(set(positions)) != len(positions):
        raise MisalignedError(f"{refuse}, but {said} names a card twice", _HINT_CHANGED)
    return positions


def read(ctx: Context) -> Answer:
    """The expectation from Slurm's allocation for this task (see the module's docstring)."""
    env = ctx.env
    var = STEP_VAR if STEP_VAR in env else JOB_VAR
    value = env[var]
    if value.strip() in ("", "NoDevFiles"):
        return f"{var}={value} names no card (gres.conf without File= device files)"
    numbers = _numbers(var, value)
    rank = local_rank(env)
    cvd = env.get(CVD)
    minors = "minor number" + ("s " if len(numbers) > 1 else " ") + ", ".join(map(str, numbers))
    refuse = f"{rank} was allocated {minors} ({var}={value})"
    cards = ctx.cards()
    allocated: list[Target] = []
    for n in numbers:
        try:
            allocated.append(by_minor(n, cards))
        except GpuSpecError:
            raise MisalignedError(
                f"{refuse}, but no card this process can see has minor number {n} (cards: {_minors(cards)})",
                "a container started by the job must get the job's cards: by UUID (--gpus device=UUID), or every card "
                "with -e SLURM_STEP_GPUS -e CUDA_VISIBLE_DEVICES; Slurm's numbers are not NVML indices, so --gpus "
                "device=$CUDA_VISIBLE_DEVICES gives other cards (`nvidia-smi -q | grep Minor` lists minor numbers)",
            ) from None
    chosen = [allocated[p] for p in _order(numbers, cvd, allocated, cards, refuse)]
    said = f"{CVD}={cvd}" if cvd is not None else f"{CVD} unset"
    return Expectation([ExpectedCard(t.uuid, t.bus_id, f"{rank}, minor number {t.card.minor_number}")
                        for t in chosen], var, f"{var}={value} and {said} ({rank})")
