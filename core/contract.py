"""The contract between the host side and the container side: the names and values both read and write.

docs/design.md describes it for people; this module is where the code reads it. Exit codes live with the error tree
(gpupin.core.errors), which gives each failure its code.
"""

# The expectation: comma-separated, in local-rank order, each UUID[@BUSID] (gpupin.core.expectation's grammar).
EXPECT_VAR = "GPUPIN_EXPECT"
# The entrypoint's switches, each also a command-line option of gpupin-entrypoint.
VERIFY_VAR = "GPUPIN_VERIFY"
REQUIRE_VAR = "GPUPIN_REQUIRE"
QUIET_VAR = "GPUPIN_QUIET"
WATCH_VAR = "GPUPIN_WATCH"
WATCH_GRACE_VAR = "GPUPIN_WATCH_GRACE"  # how long a workload stopped by --watch has between SIGTERM and SIGKILL
PROBE_TIMEOUT_VAR = "GPUPIN_PROBE_TIMEOUT"
DEVICE_LIST_DIR_VAR = "GPUPIN_DEVICE_LIST_DIR"
DRA_DIR_VAR = "GPUPIN_DRA_METADATA_DIR"
# Verification levels, weakest first; `cuda` when none is asked for.
LEVELS = ("nvml", "cuda", "torch")
LEVELS_TEXT = f"{', '.join(LEVELS[:-1])} or {LEVELS[-1]}"  # as a hint lists them: "nvml, cuda or torch"
DEFAULT_LEVEL = "cuda"
# A switch's values: on, or off (empty is off).
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")

# What the NVIDIA runtime reads to pick the cards it exposes.
NVD_VAR = "NVIDIA_VISIBLE_DEVICES"
# The Kubernetes device plugin's volume-mounts strategy: one file per device id in this folder.
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
# Kubernetes DRA device metadata (KEP-5304): the kubelet plugin framework mounts each claim's records under it.
DRA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
# Swarm's generic resources reach a task as DOCKER_RESOURCE_<KIND>; the toolkit reads the one its config names.
SWARM_PREFIX = "DOCKER_RESOURCE_"
# Slurm's GPU allocation in a task: a step's (srun), else the job's (the batch script, salloc's shell).
SLURM_GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# Every variable the NVIDIA toolkit reads to pick the devices it puts in a container: the cards (NVD_VAR, or a
# DOCKER_RESOURCE_<KIND> that its swarm-resource setting names, read before NVD_VAR), the MIG config and monitor
# capabilities of given cards, and the IMEX channels.
DEVICE_VARS = (NVD_VAR, "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS")


def picks_devices(name: str) -> bool:
    """Whether the NVIDIA toolkit reads this environment variable to pick devices (DEVICE_VARS, SWARM_PREFIX)."""
    return name in DEVICE_VARS or name.startswith(SWARM_PREFIX)


# The ledger's labels on every container hostagent pins: the UUIDs it holds, and whether others may share them.
LABEL = "gpupin.devices"
SHARED_LABEL = "gpupin.shared"
LABEL_PREFIX = "gpupin."
# The label of the ledger lock's container (gpupin.hostagent.ledger.lock).
LOCK_LABEL = "gpupin.lock"

# NVIDIA_VISIBLE_DEVICES values that name no particular card, as libnvidia-container reads them: `all` in any case
# (it compares case-insensitively), `none`, `void` and empty exactly.
ALL = "all"
NONE = "none"
VOID = "void"


def nvd_keyword(value: str) -> "str | None":
    """ALL, NONE, VOID or "" when an NVIDIA_VISIBLE_DEVICES value names no particular card; None when it lists
    devices."""
    v = value.strip()
    if v.lower() == ALL:
        return ALL
    if v in ("", NONE, VOID):
        return v
    return None


def seconds(raw: str, named: str, most: float, hint: str, zero: bool = False) -> float:
    """A switch's number of seconds, in (0, most] ([0, most] with `zero`): text, nan, inf or a value out of range
    is refused (UsageError, 64), so that a typo never becomes no limit, or a limit nobody asked for. `named` is how
    the message names the value (`GPUPIN_WATCH='x'`, `--watch 'x'`)."""
    from gpupin.core.errors import UsageError

    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not ((value >= 0) if zero else (value > 0)) or not value <= most:  # nan fails every comparison
        raise UsageError(f"{named} is not a number of seconds between 0 and {most:.0f}", hint)
    return value
