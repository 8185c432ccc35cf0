"""gpupin-entrypoint's contract in a container: the project's image (`gpupin:test`, built from the Dockerfile) on
each engine's sandbox, started with `docker run --gpus ...`, where the fake runtime hook exposes just the asked cards
as the real one does. The tests are those of tests/unit/test_entrypoint_contract.py that take `ep`, run here again
where this tier's `ep` (tests/docker/conftest.py) runs them in the container: those that a container adds to
(the runtime's hook choosing the cards, the entrypoint as PID 1, the image's own Python), each with the values that
show it. The rest (parsing, refusals before anything is verified, the report's wording) the unit tier covers: the
same code decides there, whatever runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import dra
from tests.support.entrypoint import Entrypoint, one_error_line
from tests.support.host import saw
from tests.support.scenarios import uuids
from tests.unit import test_entrypoint_contract as unit
from tests.unit.test_entrypoint_contract import (  # noqa: F401  (collected here again, with this tier's `ep`)
    test_a_dra_claim_for_another_card_is_refused_with_78,
    test_a_dra_claims_gpus_are_the_expectation,
    test_a_missing_command_ends_in_127_with_one_line,
    test_a_signal_reaches_the_workload,
    test_a_swarm_task_that_sees_more_cards_than_it_reserved_is_refused,
    test_a_workload_killed_by_a_signal_ends_in_128_plus_signal,
    test_aligned_card_execs_and_the_workload_sees_it,
    test_an_expected_card_that_is_not_there_is_refused_with_78,
    test_no_driver_library_is_69_with_a_hint,
    test_nvidia_visible_devices_indices_are_the_expectation,
    test_nvidia_visible_devices_uuids_are_the_expectation,
    test_reversed_two_card_expectation_puts_each_card_at_its_rank,
    test_the_device_plugins_volume_mounts_are_the_expectation,
    test_the_workload_replaces_the_entrypoint_same_pid,
    test_torch_level_without_torch_is_refused_with_69,
    test_without_an_expectation_it_sets_the_order_reports_and_runs,
)

A800, RTX, A800B, A800C = uuids("mixed-4")
# Every engine runs these (the engine puts the card in the container: its hook, or CDI): docs/testing.md,
# The engines.
pytestmark = pytest.mark.per_engine


@pytest.mark.parametrize("code", [0, 78, 255])
def test_the_workload_exit_code_passes_through(ep: Entrypoint, code: int) -> None:
    """Through `docker run` as the container's own code: one that is the entrypoint's too (78), the extremes."""
    unit.test_the_workload_exit_code_passes_through(ep, code)


def test_a_dra_pod_through_cdi_is_pinned_by_its_claim(ep: Entrypoint, tmp_path: Path) -> None:
    """As NVIDIA's DRA driver prepares a container: the card through CDI (its spec sets NVIDIA_VISIBLE_DEVICES=void,
    which names no card) and the claim's record bind-mounted at the KEP-5304 path; nothing else names the card.
    Engines without CDI (Docker 20.10) have no such container."""
    assert ep.sandbox is not None
    if ep.sandbox.engine == "20.10":
        pytest.skip("Docker 20.10 has no CDI")
    src = tmp_path / "metadata.json"
    src.write_text(dra.record([dra.gpu(A800C, "0000:af:00.0", "gpu-3")], claim="train-gpus"))
    src.chmod(0o644)
    tmp_path.chmod(0o755)
    mount = ("-v", f"{src}:{dra.path(dra.ROOT, claim='train-gpus')}:ro")
    r = ep.run(
        "{py}", "-m", "gpupin.entrypoint", gpus=None, docker_args=(*mount, "--device", f"nvidia.com/gpu={A800C}")
    )
    assert r.rc == 0 and saw(r.out) == [A800C], r
    assert "expectation from DRA device metadata (train-gpus/gpu; NVML's order)" in r.err
    r = ep.run(*unit.STARTED, gpus=None, docker_args=(*mount, "--device", f"nvidia.com/gpu={RTX}"))  # the wrong card
    assert r.rc == 78 and "WORKLOAD-STARTED" not in r.out, r
    line = one_error_line(r.err)
    assert line.startswith(
        f"gpupin-entrypoint: ERROR: the DRA claim train-gpus/gpu asks for {A800C}@00000000:AF:00.0 at cuda:0"
    ), line
    assert RTX in line, line
