"""``mpreplay.compat.cpprb``: cpprb 11's API and behaviour over mpreplay's buffers."""

from __future__ import annotations

import io
import multiprocessing as mp
import subprocess
import sys
from multiprocessing.managers import SyncManager

import numpy as np
import pytest
from helpers import EACH_START_METHOD, run_in_child, saved_file, uniform_and_prioritized

import mpreplay
from mpreplay.compat import cpprb

ENV = {"obs": {"shape": 3}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": 3}, "done": {}}
BOTH = uniform_and_prioritized(cpprb.ReplayBuffer, cpprb.PrioritizedReplayBuffer)


def _step(i: int, done: float = 0.0) -> dict:
    return {
        "obs": np.full(3, i, np.float32),
        "act": i,
        "rew": float(i),
        "next_obs": np.full(3, i + 1, np.float32),
        "done": done,
    }


def _filled(cls, n: int = 5, size: int = 16, **options):
    buffer = cls(size, ENV, **options)
    for i in range(n):
        buffer.add(**_step(i))
    return buffer


# -- the import ----------------------------------------------------------------------------------
def test_cpprbs_public_names_are_exposed():
    names = {
        "ReplayBuffer",
        "PrioritizedReplayBuffer",
        "MPReplayBuffer",
        "MPPrioritizedReplayBuffer",
        "ReverseReplayBuffer",
        "SelectiveReplayBuffer",
        "HindsightReplayBuffer",
        "LaBERmean",
        "LaBERlazy",
        "LaBERmax",
        "NstepBuffer",
        "create_buffer",
        "train",
    }
    assert names <= set(cpprb.__all__)
    assert all(hasattr(cpprb, name) for name in names)


def test_cpprbs_gym_helpers_are_exposed_where_gymnasium_is_installed():
    # As in cpprb, which defines them only when gym(nasium) imports.
    pytest.importorskip("gymnasium")
    names = {"create_env_dict", "create_before_add_func"}
    assert names <= set(cpprb.__all__)
    assert all(hasattr(cpprb, name) for name in names)


def test_cpprbs_submodules_hold_what_cpprb_programs_import_from_them():
    from mpreplay.compat.cpprb.PyReplayBuffer import NstepBuffer, dict2buffer

    assert NstepBuffer is cpprb.NstepBuffer and callable(dict2buffer)


def test_cpprbs_util_module_holds_its_gym_helpers_where_gymnasium_is_installed():
    pytest.importorskip("gymnasium")
    from mpreplay.compat.cpprb.util import create_env_dict

    assert create_env_dict is cpprb.create_env_dict


def test_importing_the_compat_layer_never_imports_cpprb():
    code = "import sys, mpreplay.compat.cpprb; assert 'cpprb' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- shapes, dtypes and add ------------------------------------------------------------------------
@BOTH
def test_a_field_without_shape_is_sampled_as_a_column(cls):
    batch = _filled(cls).sample(4)
    assert batch["rew"].shape == batch["done"].shape == batch["act"].shape == (4, 1)
    assert batch["obs"].shape == (4, 3)


@BOTH
def test_dtypes_are_the_env_dicts_with_float32_by_default(cls):
    batch = _filled(cls).sample(2)
    assert batch["act"].dtype == np.int64 and batch["obs"].dtype == batch["rew"].dtype == np.float32


def test_prioritized_samples_carry_float32_weights_and_uint64_indexes():
    batch = _filled(cpprb.PrioritizedReplayBuffer).sample(8)
    assert batch["weights"].dtype == np.float32 and batch["weights"].shape == (8,)
    assert batch["indexes"].dtype == np.uint64 and batch["indexes"].shape == (8,)


def test_a_uniform_sample_has_no_indexes_or_weights():
    assert set(_filled(cpprb.ReplayBuffer).sample(2)) == set(ENV)


@pytest.mark.parametrize("rew", [[1.0, 2.0], [[1.0], [2.0]], np.array([1.0, 2.0])], ids=["list", "column", "array"])
def test_a_batch_of_a_scalar_field_takes_cpprbs_layouts(rew):
    buffer = cpprb.ReplayBuffer(8, {"obs": {"shape": 3}, "rew": {}})
    buffer.add(obs=np.zeros((2, 3)), rew=rew)
    np.testing.assert_array_equal(buffer.get_all_transitions()["rew"], [[1.0], [2.0]])


def test_a_flat_value_is_reshaped_into_rows_as_cpprb_reshapes_it():
    buffer = cpprb.ReplayBuffer(8, {"obs": {"shape": 3}})
    buffer.add(obs=np.arange(6))
    np.testing.assert_array_equal(buffer.get_all_transitions()["obs"], [[0, 1, 2], [3, 4, 5]])


def test_a_value_that_is_no_whole_number_of_rows_is_refused_by_name(unchanged):
    buffer = cpprb.ReplayBuffer(8, {"obs": {"shape": 3}})
    with pytest.raises(ValueError, match="obs"):
        buffer.add(obs=np.arange(4))
    assert buffer.get_stored_size() == 0


def test_keys_of_no_field_are_ignored():
    buffer = cpprb.ReplayBuffer(8, {"done": {}})
    buffer.add(done=1.0, priority=0.5, info="ignored")
    assert buffer.get_stored_size() == 1


def test_a_missing_field_raises_key_error_and_stores_nothing():
    buffer = cpprb.ReplayBuffer(8, ENV)
    with pytest.raises(KeyError, match="rew"):
        buffer.add(obs=np.zeros(3), act=1, next_obs=np.zeros(3), done=0)
    assert buffer.get_stored_size() == 0


def test_a_float_size_and_the_env_dict_are_taken_as_cpprb_takes_them():
    env_dict = {"obs": {"shape": 3}, "rew": {}}
    before = {name: dict(options) for name, options in env_dict.items()}
    buffer = cpprb.ReplayBuffer(1e2, env_dict)
    assert buffer.get_buffer_size() == 100
    assert env_dict == before


def test_an_env_dict_cpprb_has_annotated_is_accepted():
    annotated = {"obs": {"shape": 3, "add_shape": np.array([-1, 3])}, "rew": {"add_shape": np.array([-1, 1])}}
    buffer = cpprb.ReplayBuffer(8, annotated)
    buffer.add(obs=np.zeros(3), rew=1.0)
    assert buffer.sample(1)["rew"].shape == (1, 1)


def test_an_unknown_constructor_option_is_refused_by_name():
    with pytest.raises(TypeError, match="obs_shape"):
        cpprb.PrioritizedReplayBuffer(8, ENV, obs_shape=(3,))


def test_mmap_prefix_keeps_each_field_in_the_file_cpprb_names(tmp_path):
    rb = cpprb.ReplayBuffer(8, {"done": {}}, mmap_prefix=str(tmp_path / "rb"))
    rb.add(done=1.0)
    assert (tmp_path / "rb_done.dat").exists()
    assert rb.get_all_transitions()["done"].tolist() == [[1.0]]


@BOTH
def test_sampling_an_empty_buffer_is_refused(cls):
    with pytest.raises(ValueError, match="no transition"):
        cls(8, ENV).sample(1)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.float16, np.float64, np.complex64, np.bool_, int, bool])
def test_a_field_keeps_its_dtype(dtype):
    buffer = cpprb.ReplayBuffer(4, {"a": {"dtype": dtype}})
    buffer.add(a=np.ones(1, dtype=dtype))
    assert buffer.get_all_transitions()["a"].dtype == np.dtype(dtype)


def test_values_out_of_the_fields_range_are_refused():
    buffer = cpprb.ReplayBuffer(4, {"a": {"dtype": np.uint8}})
    with pytest.raises(ValueError, match="'a'"):
        buffer.add(a=256)


# -- reading --------------------------------------------------------------------------------------
def test_all_transitions_come_in_index_order_once_the_buffer_wrapped():
    buffer = cpprb.ReplayBuffer(3, {"a": {}})
    for a in range(5):
        buffer.add(a=a)
    np.testing.assert_array_equal(buffer.get_all_transitions()["a"], [[3], [4], [2]])


def test_shuffled_transitions_are_a_permutation_of_them():
    buffer = cpprb.ReplayBuffer(64, {"a": {}})
    buffer.add(a=np.arange(64))
    shuffled = buffer.get_all_transitions(shuffle=True)["a"].ravel()
    np.testing.assert_array_equal(np.sort(shuffled), np.arange(64))


def test_encode_sample_returns_the_transitions_at_the_indexes():
    buffer = cpprb.ReplayBuffer(8, {"a": {}})
    buffer.add(a=np.arange(5))
    np.testing.assert_array_equal(buffer._encode_sample([4, 0])["a"], [[4], [0]])
    np.testing.assert_array_equal(buffer._encode_sample(2)["a"], [[2]])


def test_encode_sample_refuses_an_index_that_holds_nothing():
    buffer = cpprb.ReplayBuffer(8, {"a": {}})
    buffer.add(a=1)
    with pytest.raises(ValueError, match="slot 5"):
        buffer._encode_sample([5])


def test_the_episode_length_counts_the_transitions_since_the_episode_began():
    buffer = cpprb.ReplayBuffer(8, {"a": {}})
    buffer.add(a=[1, 2])
    assert buffer.get_current_episode_len() == 2
    buffer.on_episode_end()
    assert buffer.get_current_episode_len() == 0
    buffer.add(a=3)
    assert buffer.get_current_episode_len() == 1


def test_clear_forgets_everything():
    buffer = _filled(cpprb.ReplayBuffer)
    buffer.clear()
    assert buffer.get_stored_size() == buffer.get_next_index() == 0


def test_next_of_adds_the_next_fields_and_stores_what_was_given():
    buffer = cpprb.ReplayBuffer(8, {"obs": {"shape": 2}}, next_of="obs", stack_compress="obs")
    buffer.add(obs=[0, 1], next_obs=[5, 6])
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["next_obs"], [[5, 6]])


# -- priorities -----------------------------------------------------------------------------------
def test_the_max_priority_starts_at_one_and_only_grows():
    buffer = cpprb.PrioritizedReplayBuffer(8, {"a": {}})
    assert buffer.get_max_priority() == 1.0
    buffer.add(a=0, priorities=0.25)
    assert buffer.get_max_priority() == 1.0
    buffer.add(a=1, priorities=5.0)
    buffer.update_priorities([1], [0.5])
    assert buffer.get_max_priority() == 5.0


def test_clear_resets_the_max_priority():
    buffer = cpprb.PrioritizedReplayBuffer(8, {"a": {}})
    buffer.add(a=0, priorities=5.0)
    buffer.clear()
    assert buffer.get_max_priority() == 1.0


def test_a_new_transition_gets_the_largest_priority_ever_set(assert_frequencies):
    buffer = cpprb.PrioritizedReplayBuffer(8, {"a": {}}, alpha=1.0, eps=0.0)
    buffer.add(a=0, priorities=4.0)
    buffer.update_priorities([0], [1.0])  # the largest stored is 1 now; the largest ever set stays 4
    buffer.add(a=1)
    counts = np.bincount(buffer.sample(4000)["a"].ravel().astype(int), minlength=2)
    assert_frequencies(counts, np.array([1.0, 4.0]))


def test_one_priority_sets_every_index(assert_frequencies):
    buffer = cpprb.PrioritizedReplayBuffer(8, {"a": {}}, alpha=1.0, eps=0.0)
    buffer.add(a=[0, 1, 2], priorities=[1.0, 1.0, 8.0])
    buffer.update_priorities([0, 1, 2], 2.0)
    counts = np.bincount(buffer.sample(3000)["a"].ravel().astype(int), minlength=3)
    assert_frequencies(counts, np.ones(3))


@pytest.mark.parametrize("dtype", [np.uint64, np.int32, np.uint8, np.float32, np.float64])
def test_indexes_of_any_integer_or_integral_float_dtype_are_taken(dtype):
    buffer = _filled(cpprb.PrioritizedReplayBuffer)
    buffer.update_priorities(np.arange(3, dtype=dtype), np.full(3, 2.0))
    assert buffer.get_max_priority() == 2.0


def test_fractional_indexes_are_refused():
    buffer = _filled(cpprb.PrioritizedReplayBuffer)
    with pytest.raises(ValueError, match="indexes"):
        buffer.update_priorities(np.array([0.5]), [1.0])


def test_no_priorities_is_a_type_error():
    with pytest.raises(TypeError, match="priorities"):
        _filled(cpprb.PrioritizedReplayBuffer).update_priorities([0], None)


@pytest.mark.parametrize("priority", [-1.0, np.nan, np.inf], ids=["negative", "nan", "inf"])
def test_bad_priorities_are_refused(priority):
    buffer = _filled(cpprb.PrioritizedReplayBuffer)
    with pytest.raises(ValueError, match="priorities"):
        buffer.add(**_step(9), priorities=priority)
    with pytest.raises(ValueError, match="priorities"):
        buffer.update_priorities([0], [priority])
    assert buffer.get_stored_size() == 5


def test_priorities_that_disagree_with_the_batch_are_refused():
    buffer = cpprb.PrioritizedReplayBuffer(8, {"a": {}})
    with pytest.raises(ValueError, match="priorities"):
        buffer.add(a=np.ones(5), priorities=np.ones(3))
    assert buffer.get_stored_size() == 0


def test_an_update_of_a_slot_overwritten_since_it_was_sampled_is_dropped():
    buffer = cpprb.PrioritizedReplayBuffer(1, {"a": {}}, alpha=1.0, eps=0.0)
    buffer.add(a=0)
    indexes = buffer.sample(1)["indexes"]
    buffer.add(a=1)  # overwrites slot 0
    buffer.update_priorities(indexes, [7.0])
    assert buffer.get_max_priority() == 1.0


def test_with_check_for_update_an_update_of_a_slot_not_sampled_is_dropped():
    buffer = cpprb.PrioritizedReplayBuffer(4, {"a": {}}, check_for_update=True)
    buffer.add(a=[0, 1])
    buffer.update_priorities([1], [3.0])
    assert buffer.get_max_priority() == 1.0
    while 1 not in buffer.sample(4)["indexes"]:
        pass
    buffer.update_priorities([1], [3.0])
    assert buffer.get_max_priority() == 3.0


def test_without_check_for_update_an_update_of_a_slot_not_sampled_applies():
    buffer = cpprb.PrioritizedReplayBuffer(4, {"a": {}})
    buffer.add(a=[0, 1])
    buffer.update_priorities([1], [3.0])
    assert buffer.get_max_priority() == 3.0


# -- n steps --------------------------------------------------------------------------------------
NSTEP_ENV = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}


def _nstep_steps(dones):
    return [dict(obs=t, rew=t + 1.0, next_obs=t + 1, done=d) for t, d in enumerate(dones)]


def test_a_row_is_stored_by_the_add_of_its_nth_step():
    buffer = cpprb.ReplayBuffer(16, NSTEP_ENV, Nstep={"size": 3, "rew": "rew", "next": "next_obs"})
    steps = _nstep_steps([0, 0, 0, 0])
    assert [buffer.add(**s) for s in steps] == [None, None, 0, 1]


def test_rewards_fold_until_a_terminal_step_and_flags_it():
    gamma = 0.5
    buffer = cpprb.ReplayBuffer(16, NSTEP_ENV, Nstep={"size": 3, "gamma": gamma, "rew": "rew", "next": "next_obs"})
    for step in _nstep_steps([0, 1, 0, 0, 0]):
        buffer.add(**step)
    stored = buffer.get_all_transitions()
    np.testing.assert_allclose(stored["rew"].ravel(), [1 + gamma * 2, 2, 3 + gamma * 4 + gamma**2 * 5])
    np.testing.assert_array_equal(stored["done"].ravel(), [1, 1, 0])
    np.testing.assert_array_equal(stored["next_obs"].ravel(), [3, 4, 5])


def test_a_row_whose_last_folded_step_is_terminal_is_done():
    buffer = cpprb.ReplayBuffer(16, NSTEP_ENV, Nstep={"size": 3, "rew": "rew", "next": "next_obs"})
    for step in _nstep_steps([0, 0, 1]):
        buffer.add(**step)
    assert buffer.get_all_transitions()["done"].ravel().tolist() == [1]


def test_on_episode_end_stores_pending_rows_with_the_last_next_observation():
    buffer = cpprb.ReplayBuffer(16, NSTEP_ENV, Nstep={"size": 3, "gamma": 1.0, "rew": "rew", "next": "next_obs"})
    for step in _nstep_steps([0, 0, 0]):
        buffer.add(**step)
    buffer.on_episode_end()
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["obs"].ravel(), [0, 1, 2])
    np.testing.assert_allclose(stored["rew"].ravel(), [6, 5, 3])
    np.testing.assert_array_equal(stored["next_obs"].ravel(), [3, 3, 3])


def test_consecutive_steps_in_one_add_fold_as_single_adds():
    options = {"Nstep": {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}}
    one, batched = cpprb.ReplayBuffer(16, NSTEP_ENV, **options), cpprb.ReplayBuffer(16, NSTEP_ENV, **options)
    steps = _nstep_steps([0, 0, 1, 0, 0, 0])
    for s in steps:
        one.add(**s)
    batched.add(**{name: [s[name] for s in steps] for name in NSTEP_ENV})
    for name, rows in one.get_all_transitions().items():
        np.testing.assert_array_equal(batched.get_all_transitions()[name], rows, err_msg=name)


def test_an_nstep_buffer_keeps_cpprbs_signature_and_shapes():
    folder = cpprb.NstepBuffer({"rew": {}, "done": {}}, {"size": 2, "rew": "rew", "gamma": 0.5})
    assert folder.add(rew=1, done=0) is None
    out = folder.add(rew=2, done=0)
    np.testing.assert_allclose(out["rew"], [[2.0]])
    assert folder.get_Nstep_size() == 2


def test_an_nstep_buffer_needs_a_done_field():
    with pytest.raises(ValueError, match="done"):
        cpprb.NstepBuffer({"rew": {}}, {"size": 2})


def test_a_prioritized_nstep_row_gets_the_priority_of_its_first_step(assert_frequencies):
    buffer = cpprb.PrioritizedReplayBuffer(16, NSTEP_ENV, alpha=1.0, eps=0.0, Nstep={"size": 2, "rew": "rew"})
    for step, p in zip(_nstep_steps([0, 0, 0]), [1.0, 3.0, 9.0], strict=True):
        buffer.add(**step, priorities=p)
    counts = np.bincount(buffer.sample(4000)["obs"].ravel().astype(int), minlength=2)
    assert_frequencies(counts, np.array([1.0, 3.0]))


def test_is_nstep_tells_whether_the_buffer_folds():
    assert cpprb.ReplayBuffer(8, NSTEP_ENV, Nstep={"size": 2}).is_Nstep()
    assert not cpprb.ReplayBuffer(8, NSTEP_ENV).is_Nstep()


# -- files ----------------------------------------------------------------------------------------
def test_saved_transitions_load_into_another_buffer():
    source = _filled(cpprb.ReplayBuffer)
    f = io.BytesIO()
    source.save_transitions(f)
    f.seek(0)
    target = cpprb.ReplayBuffer(16, ENV)
    target.load_transitions(f)
    for name, rows in source.get_all_transitions().items():
        np.testing.assert_array_equal(target.get_all_transitions()[name], rows)


def test_a_file_of_nstep_rows_is_refused_by_a_buffer_that_does_not_fold():
    source = cpprb.ReplayBuffer(8, {"done": {}}, Nstep={"size": 2})
    source.add(done=[0, 0, 1])
    f = io.BytesIO()
    source.save_transitions(f)
    f.seek(0)
    with pytest.raises(ValueError, match=r"nstep|n-step|folded"):
        cpprb.ReplayBuffer(8, {"done": {}}).load_transitions(f)


SCALARS = ["act", "rew", "done"]  # the fields of ENV given no shape: (1,) here, () in the native buffers


def test_a_file_of_the_layer_loads_into_a_native_buffer_of_the_same_env_dict():
    source = _filled(cpprb.ReplayBuffer)
    target = mpreplay.ReplayBuffer(16, ENV)
    target.load_transitions(saved_file(source))
    saved, loaded = source.get_all_transitions(), target.get_all_transitions()
    for name in SCALARS:
        assert saved[name].shape == (5, 1) and loaded[name].shape == (5,)
        np.testing.assert_array_equal(loaded[name], saved[name][:, 0])
    for name in ("obs", "next_obs"):
        np.testing.assert_array_equal(loaded[name], saved[name])


def test_a_native_buffers_file_loads_into_a_buffer_of_the_layer_of_the_same_env_dict():
    source = mpreplay.ReplayBuffer(16, ENV)
    for i in range(5):
        source.add(**_step(i))
    target = cpprb.ReplayBuffer(16, ENV)
    target.load_transitions(saved_file(source))
    saved, loaded = source.get_all_transitions(), target.get_all_transitions()
    for name in SCALARS:
        assert saved[name].shape == (5,) and loaded[name].shape == (5, 1)
        np.testing.assert_array_equal(loaded[name][:, 0], saved[name])
    for name in ("obs", "next_obs"):
        np.testing.assert_array_equal(loaded[name], saved[name])


@pytest.mark.parametrize(
    "spec, stored",
    [
        ({"shape": 2, "dtype": np.int64}, r"shape \(2,\) int64"),
        ({"shape": (1, 1), "dtype": np.int64}, r"shape \(1, 1\) int64"),
        ({"dtype": np.int32}, r"shape \(1,\) int32"),
    ],
    ids=["two values", "one value in two dimensions", "another dtype"],
)
def test_a_file_whose_field_differs_from_a_scalar_otherwise_is_refused_naming_it(spec, stored, unchanged):
    source = cpprb.ReplayBuffer(16, {**ENV, "act": spec})
    target = mpreplay.ReplayBuffer(16, ENV)
    with (
        unchanged(target),
        pytest.raises(ValueError, match=rf"field 'act': the file stores {stored}, the buffer expects shape \(\) int64"),
    ):
        target.load_transitions(saved_file(source))


def test_a_file_that_is_neither_format_is_refused():
    with pytest.raises(ValueError, match="neither"):
        cpprb.ReplayBuffer(8, ENV).load_transitions(io.BytesIO(b"not an archive"))


# -- shared buffers -------------------------------------------------------------------------------
def _add_in_child(buffer, values) -> None:
    for v in values:
        buffer.add(a=v, priorities=0.5)


@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_a_shared_buffer_takes_adds_from_a_child_process(method):
    buffer = cpprb.MPPrioritizedReplayBuffer(16, {"a": {"dtype": np.int64}}, ctx=mp.get_context(method))
    assert run_in_child(method, _add_in_child, buffer, range(5)) == 0
    np.testing.assert_array_equal(buffer.get_all_transitions()["a"].ravel(), np.arange(5))
    buffer.close()


@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_a_child_that_sampled_nothing_cannot_update_priorities(method):
    buffer = cpprb.MPPrioritizedReplayBuffer(4, {"a": {}})
    buffer.add(a=[0, 1])
    buffer.sample(8)  # the parent sampled; the child has not
    assert run_in_child(method, buffer.update_priorities, [0, 1], [9.0, 9.0]) == 0
    assert buffer.get_max_priority() == 1.0
    buffer.close()


def test_a_shared_buffer_drops_updates_of_slots_this_process_did_not_sample():
    buffer = cpprb.MPPrioritizedReplayBuffer(1, {"done": {}})
    buffer.add(done=1.0)
    buffer.update_priorities([0], [2.0])
    assert buffer.get_max_priority() == 1.0
    buffer.sample(1)
    buffer.update_priorities([0], [2.0])
    assert buffer.get_max_priority() == 2.0
    buffer.close()


def _write_whole_rows(buffer, start: int, count: int) -> None:
    for i in range(start, start + count):
        buffer.add(id=i, obs=np.full(256, i, np.int64))


@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_a_shared_buffer_never_hands_out_a_row_being_written(method):
    ctx = mp.get_context(method)
    buffer = cpprb.MPPrioritizedReplayBuffer(32, {"id": {"dtype": np.int64}, "obs": {"shape": 256, "dtype": np.int64}})
    buffer.add(id=-1, obs=np.full(256, -1, np.int64))
    writers = [ctx.Process(target=_write_whole_rows, args=(buffer, 1000 * w, 3000)) for w in (1, 2)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        batch = buffer.sample(64)
        assert (batch["obs"] == batch["id"]).all()  # every element of a row from the same add
        rows = buffer.get_all_transitions()
        assert (rows["obs"] == rows["id"]).all()
    for w in writers:
        w.join(30)
        assert w.exitcode == 0
    buffer.close()


@pytest.mark.parametrize("backend", ["sharedctypes", "SharedMemory"])
def test_cpprbs_backends_are_accepted(backend):
    with cpprb.MPReplayBuffer(4, {"a": {}}, backend=backend) as buffer:
        buffer.add(a=1)
        assert buffer.get_stored_size() == 1


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        cpprb.MPReplayBuffer(4, {"a": {}}, backend="UNKNOWN")


def test_a_manager_that_has_shut_down_is_refused_as_context():
    with SyncManager() as manager:
        pass
    with pytest.raises(mp.ProcessError, match="ctx"):
        cpprb.MPReplayBuffer(4, {"a": {}}, ctx=manager)


def test_a_context_of_another_kind_is_refused():
    with pytest.raises(TypeError, match="ctx"):
        cpprb.MPReplayBuffer(4, {"a": {}}, ctx="spawn")


def test_shared_buffers_take_no_options_cpprb_ignores_for_them():
    with pytest.raises(TypeError, match="next_of"):
        cpprb.MPReplayBuffer(4, {"a": {}}, next_of="a")


# -- the other classes ----------------------------------------------------------------------------
def test_a_reverse_buffer_sweeps_back_by_stride():
    buffer = cpprb.ReverseReplayBuffer(20, {"obs": {}}, stride=5)
    buffer.add(obs=np.arange(20))
    firsts = [buffer.sample(2)["obs"].ravel().tolist() for _ in range(3)]
    assert firsts == [[19, 14], [18, 13], [17, 12]]


def test_a_reverse_buffer_starts_again_from_the_newest_once_two_strides_behind():
    buffer = cpprb.ReverseReplayBuffer(20, {"obs": {}}, stride=2)
    buffer.add(obs=np.arange(20))
    starts = [int(buffer.sample(1)["obs"][0, 0]) for _ in range(6)]
    assert starts == [19, 18, 17, 16, 19, 18]


def test_a_selective_buffer_returns_and_deletes_episodes():
    buffer = cpprb.SelectiveReplayBuffer(10, obs_dim=2, act_dim=1, Nepisodes=2)
    done = np.array([0, 1, 0, 0, 1, 0])
    buffer.add(np.arange(12).reshape(6, 2), np.zeros(6), np.arange(6), np.ones((6, 2)), done)
    assert buffer.get_stored_episode_size() == 3
    np.testing.assert_array_equal(buffer.get_episode(1)["rew"].ravel(), [2, 3, 4])
    assert buffer.delete_episode(1) == 3
    np.testing.assert_array_equal(buffer.get_episode(1)["rew"].ravel(), [5])
    assert buffer.get_next_index() == 3


def test_a_selective_buffer_drops_steps_beyond_its_capacity():
    buffer = cpprb.SelectiveReplayBuffer(2, Nepisodes=2)
    buffer.add(np.arange(6), np.zeros(6), np.zeros(6), np.zeros(6), np.zeros(6))
    assert buffer.get_stored_size() == 4
    assert buffer.sample(3)["done"].shape == (3, 1)


@pytest.mark.parametrize("cls, weights", [(cpprb.LaBERmean, 1.0), (cpprb.LaBERlazy, 4.0), (cpprb.LaBERmax, 1.0)])
def test_laber_weights_follow_the_variants_rule_for_equal_priorities(cls, weights):
    out = cls(2, 2)(priorities=[1, 1, 1, 1], obs=np.arange(4))
    np.testing.assert_allclose(out["weights"], [weights, weights])
    np.testing.assert_array_equal(out["obs"], out["indexes"])


def test_laber_draws_only_transitions_of_nonzero_priority():
    out = cpprb.LaBERmean(3, 2, eps=0)(priorities=[0, 0, 5, 0, 0, 0])
    np.testing.assert_array_equal(out["indexes"], [2, 2, 2])


def test_laber_refuses_priorities_of_another_size():
    with pytest.raises(ValueError, match="priorities"):
        cpprb.LaBERmax(4, 2)(priorities=[1.0] * 4)


def _her(strategy, **options):
    return cpprb.HindsightReplayBuffer(
        32,
        {"obs": {}, "act": {}, "next_obs": {}},
        max_episode_len=4,
        reward_func=lambda s, a, g: -1.0 * (s != g),
        strategy=strategy,
        additional_goals=2,
        prioritized=False,
        **options,
    )


@pytest.mark.parametrize("strategy, copies", [("future", 3), ("episode", 3), ("random", 3), ("final", 2)])
def test_her_stores_the_episode_and_its_relabelled_copies(strategy, copies):
    buffer = _her(strategy)
    for t in range(3):
        buffer.add(obs=t, act=0, next_obs=t + 1)
    buffer.on_episode_end(10)
    assert buffer.get_stored_size() == 3 * copies
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["goal"][:3].ravel(), [10, 10, 10])
    np.testing.assert_array_equal(stored["rew"], -1.0 * (stored["next_obs"] != stored["goal"]))


def test_her_future_goals_are_reached_at_or_after_each_step():
    buffer = _her("future")
    for t in range(4):
        buffer.add(obs=t, act=0, next_obs=t + 1)
    buffer.on_episode_end(10)
    relabelled = {k: v[4:] for k, v in buffer.get_all_transitions().items()}
    assert (relabelled["goal"] >= relabelled["next_obs"]).all()


def test_her_refuses_an_episode_longer_than_its_maximum():
    buffer = _her("future")
    for t in range(4):
        buffer.add(obs=t, act=0, next_obs=t + 1)
    with pytest.raises(ValueError, match="max_episode_len"):
        buffer.add(obs=4, act=0, next_obs=5)


def test_her_without_priorities_refuses_priority_calls():
    with pytest.raises(ValueError, match="prioritized"):
        _her("final").get_max_priority()


def test_dict2buffer_lays_stacks_out_as_sliding_windows():
    from mpreplay.compat.cpprb.PyReplayBuffer import dict2buffer

    env_dict = {"a": {"shape": (3, 3)}, "b": {}}
    arrays = dict2buffer(10, env_dict, stack_compress="a")
    a = arrays["a"]
    assert a.shape == (10, 3, 3) and arrays["b"].shape == (10, 1)
    assert a.strides == (3 * a.itemsize, a.itemsize, 3 * a.itemsize)
    assert env_dict == {"a": {"shape": (3, 3)}, "b": {}}


# -- train ----------------------------------------------------------------------------------------
class _Counter:
    """An environment with gym's 4-tuple step: episodes of 3 steps."""

    def reset(self):
        self.t = 0
        return np.zeros(3)

    def step(self, action):
        self.t += 1
        return np.full(3, self.t), 1.0, self.t == 3, {}


class _GymnasiumCounter(_Counter):
    def reset(self):
        return super().reset(), {}

    def step(self, action):
        obs, rew, done, info = super().step(action)
        return obs, rew, done, False, info


@pytest.mark.parametrize("env", [_Counter(), _GymnasiumCounter()], ids=["gym", "gymnasium"])
@pytest.mark.filterwarnings("ignore:cpprb.train")
def test_train_stores_every_step_and_ends_episodes(env):
    buffer = cpprb.PrioritizedReplayBuffer(
        32, {"obs": {"shape": 3}, "act": {}, "rew": {}, "next_obs": {"shape": 3}, "done": {}}
    )
    episodes = []
    cpprb.train(
        buffer,
        env,
        lambda obs, step, episode, warmup: 0,
        lambda sample, step, episode: 0.5,
        max_steps=9,
        episode_callback=lambda episode, step, reward: episodes.append(episode),
    )
    assert buffer.get_stored_size() == 9
    assert episodes == [0, 1, 2]
    assert buffer.get_max_priority() == 1.0


def test_train_with_a_prioritized_buffer_needs_priorities_back():
    buffer = cpprb.PrioritizedReplayBuffer(
        8, {"obs": {"shape": 3}, "act": {}, "rew": {}, "next_obs": {"shape": 3}, "done": {}}
    )
    with pytest.warns(UserWarning), pytest.raises(TypeError, match="priorities"):
        cpprb.train(buffer, _Counter(), lambda *a: 0, lambda *a: None, max_steps=2)
