"""The order the suite's tests are handed to pytest-xdist's workers: the longest first.

``python -m pytest -n 2`` (``--dist worksteal``) hands each worker a contiguous share of the
collected tests (the first half to one, the second to the other) and lets an idle worker take the
last half of another's queue. A test of minutes that starts last therefore costs its minutes of
wall time with the other worker idle. :func:`order` puts the known-long tests (:data:`LONG`) at
the head of each worker's share, balanced by their seconds, so that the long tests start at once
on every worker and the short ones fill in after them, in their order; the tests that share a
fixture of a module with a long one stay beside it (the fixture is set up once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

#: Seconds (setup and call, inside an xdist worker of ``pytest -n 2`` on two cores) of the tests
#: that take longest, by file and test: a rough measure, only for the order (tests/test_schedule.py
#: checks that each names a test). A test missing from here is taken as short.
_BY_FILE: dict[str, dict[str, float]] = {
    "tests/test_docs.py": {
        "test_code_blocks_run[1-device-pages-1]": 157,
        "test_code_blocks_run[1-device-pages-2]": 116,
        "test_code_blocks_run[4-device-pages-1]": 32,
    },
    "tests/test_sharding.py": {
        "test_zero1_and_fsdp_train_as_replicated_on_eight_devices": 65,
        "test_fsdp_killed_on_eight_devices_resumes_on_four_and_two_as_never_stopped": 56,
    },
    "tests/test_distributed.py": {
        "test_both_processes_killed_while_saving_always_leave_a_loadable_checkpoint": 47,
        "test_same_parameters_as_one_process_with_four_devices": 33,
        "test_a_dead_process_stops_the_other_within_the_timeout": 20,
    },
    "tests/test_structured.py": {
        "test_structured_batches_on_four_devices": 44,
        "test_structured_batches_on_one_device": 43,
        "test_hooks_run_outside_the_compiled_steps_and_give_their_numbers": 34,
    },
    "tests/data/test_pipelines.py": {
        "test_validation_split_and_index_driven_training_do_not_depend_on_devices": 40,
    },
    "tests/test_examples.py": {
        # the first test sets up the one run of all the examples (a module's fixture)
        "test_finetune_from_weights_it_draws": 65,
    },
    "tests/test_steps.py": {
        "test_one_easyfit_step_equals_one_plain_optax_step": 35,
    },
    "tests/test_parallel.py": {
        "test_every_device_holds_a_replica_and_accuracy_agrees": 33,
    },
    "tests/test_trainer.py": {
        "test_ten_trainers_closed_after_twenty_leave_memory_and_threads_flat": 32,
    },
    "tests/test_deterministic.py": {
        "test_the_flag_gets_into_xla_flags_before_the_backend_starts": 24,
    },
    "tests/test_steps_per_epoch.py": {
        "test_on_four_devices": 24,
    },
    "tests/data/test_dense_targets_devices.py": {
        "test_the_device_count_does_not_change_training_on_dense_targets": 22,
    },
    "tests/test_benchmarks.py": {
        "test_make_data_lmdb_then_bench_with_the_hand_written_lmdb_loop": 21,
        "test_parquet_vs_folder_writes_the_same_jpegs_and_trains_alike_on_each": 21,
    },
    "easyfit/models/resnet.py": {
        "easyfit.models.resnet.ResNet": 20,
    },
    "tests/test_keras_first_hour.py": {
        "test_labels_of_shape_n_1_and_one_hot_floats_train_as_class_indices": 20,
    },
    "tests/callbacks/test_backup_and_restore.py": {
        "test_sigkill_mid_epoch_then_restart_gives_the_same_parameters": 19,
    },
    "tests/test_recipe.py": {
        "test_a_loaded_model_predicts_and_evaluates_what_the_trained_one_did[1]": 18,
        "test_a_loaded_model_predicts_and_evaluates_what_the_trained_one_did[4]": 18,
    },
    "tests/test_interrupt.py": {
        "test_sigterm_backs_up_exits_143_and_resumes_exactly": 18,
    },
}
LONG: dict[str, float] = {f"{f}::{t}": s for f, tests in _BY_FILE.items() for t, s in tests.items()}


class _Item(Protocol):
    nodeid: str


T = TypeVar("T", bound=_Item)


def _module(item: _Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pinned(item: Any) -> bool:
    """Whether ``item`` uses a fixture of a module, class or package: it then stays beside the
    other tests of its module that do (the fixture is set up once for them)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("package", "module", "class") for group in defs for d in group)


def order(
    items: Sequence[T],
    workers: int,
    long: dict[str, float] = LONG,
    pinned: Callable[[Any], bool] = pinned,
) -> list[T]:
    """``items`` in the order to hand to ``workers`` workers (see the module's docstring).

    The known-long tests of ``long`` (each with the tests of its module that share a fixture
    of the module with it, ``pinned``, the long ones first) are dealt out to the workers, the
    longest first, each to the worker with the fewest seconds so far, and open that worker's
    share (the share xdist's work-stealing scheduler gives: ``len(items) // workers`` or one
    more); the other tests fill the shares in their own order."""
    units: dict[str, list[T]] = {}
    for item in items:
        units.setdefault(f"module {_module(item)}" if pinned(item) else item.nodeid, []).append(item)
    cost = {key: sum(long.get(i.nodeid, 0) for i in group) for key, group in units.items()}
    heavy = sorted((key for key in units if cost[key] > 0), key=lambda k: -cost[k])
    lanes: list[list[T]] = [[] for _ in range(max(workers, 1))]
    seconds = [0.0] * len(lanes)
    for key in heavy:
        lane = seconds.index(min(seconds))
        seconds[lane] += cost[key]
        lanes[lane] += sorted(units[key], key=lambda i: -long.get(i.nodeid, 0))  # stable
    rest = [item for key, group in units.items() if cost[key] == 0 for item in group]
    ordered: list[T] = []
    remaining = len(items)
    for i, lane in enumerate(lanes):
        share = remaining // (len(lanes) - i)  # as xdist's worksteal deals the first shares
        remaining -= share
        fill = max(share - len(lane), 0)
        ordered += lane + rest[:fill]
        rest = rest[fill:]
    return ordered + rest
