"""gpupin-entrypoint's contract in a container: the project's image (`gpupin:test`, built from the Dockerfile) on
each engine's sandbox, started with `docker run --gpus ...`, where the fake runtime hook exposes just the asked cards
as the real one does. The tests are those of tests/unit/test_entrypoint_contract.py that take `ep`, collected here
again: this tier's `ep` (tests/docker/conftest.py) runs them in the container.
"""

from __future__ import annotations

from tests.unit.test_entrypoint_contract import (  # noqa: F401  (collected here again, with this tier's `ep`)
    test_a_command_that_cannot_be_executed_ends_in_126,
    test_a_malformed_expectation_is_refused_with_64,
    test_a_missing_command_ends_in_127_with_one_line,
    test_a_signal_reaches_the_workload,
    test_a_swarm_task_that_sees_more_cards_than_it_reserved_is_refused,
    test_a_workload_killed_by_a_signal_ends_in_128_plus_signal,
    test_aligned_card_execs_and_the_workload_sees_it,
    test_an_expected_card_that_is_not_there_is_refused_with_78,
    test_an_inherited_cuda_visible_devices_is_overridden_and_reported,
    test_bad_usage_is_64,
    test_check_mode_json_report_on_stdout,
    test_no_driver_library_is_69_with_a_hint,
    test_nvidia_visible_devices_indices_are_the_expectation,
    test_nvidia_visible_devices_uuids_are_the_expectation,
    test_options_after_the_command_belong_to_the_workload,
    test_quiet_prints_nothing_on_success,
    test_require_refuses_a_missing_expectation,
    test_reversed_two_card_expectation_puts_each_card_at_its_rank,
    test_the_device_plugins_volume_mounts_are_the_expectation,
    test_the_workload_exit_code_passes_through,
    test_the_workload_replaces_the_entrypoint_same_pid,
    test_torch_level_without_torch_is_refused_with_69,
    test_uuid_of_one_card_with_the_bus_id_of_another_is_refused_with_78,
    test_without_an_expectation_it_sets_the_order_reports_and_runs,
)
