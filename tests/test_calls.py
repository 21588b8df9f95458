"""Specification of the buffers' per-step calls (ext/calls.pyx): add, sample and
update_priorities go straight into the table for the usual call, and every other call
behaves as the buffer's Python methods and argument checks say."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
from helpers import EACH_BUFFER_CLASS, slot_priorities

from mpreplay import BufferClosed, MPPrioritizedReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer

ENV = {"obs": {"shape": (2,)}, "act": {"dtype": np.int64}}


def _filled(cls, seed: int = 0):
    buffer = cls(16, ENV, seed=seed)
    buffer.add(obs=np.arange(32.0).reshape(16, 2), act=np.arange(16))
    return buffer


@EACH_BUFFER_CLASS
def test_numpy_integer_batch_sizes_draw_what_python_integers_draw(cls):
    a, b = _filled(cls), _filled(cls)
    np.testing.assert_array_equal(a.sample(np.int32(5))["indexes"], b.sample(5)["indexes"])


def test_an_integral_beta_weighs_as_the_same_float_does():
    a, b = _filled(PrioritizedReplayBuffer), _filled(PrioritizedReplayBuffer)
    a.update_priorities(np.arange(16), np.linspace(0.1, 3.0, 16))
    b.update_priorities(np.arange(16), np.linspace(0.1, 3.0, 16))
    np.testing.assert_array_equal(a.sample(8, 1)["weights"], b.sample(8, 1.0)["weights"])


@pytest.mark.parametrize(
    "beta, error",
    [(-0.5, ValueError), (float("nan"), ValueError), (float("inf"), ValueError), ("0.4", TypeError)],
)
def test_a_beta_outside_the_fast_path_is_checked_and_refused_by_name(beta, error):
    buffer = _filled(PrioritizedReplayBuffer)
    with pytest.raises(error, match="beta"):
        buffer.sample(4, beta)


def test_update_priorities_takes_lists_of_python_numbers():
    buffer = _filled(PrioritizedReplayBuffer)
    buffer.update_priorities([0, 3], [5.0, 7])
    assert buffer.get_max_priority() == 7.0


def test_a_one_row_add_given_a_priority_stores_that_priority():
    buffer = PrioritizedReplayBuffer(4, ENV)
    buffer.add(obs=[1.0, 2.0], act=3, priorities=2.5)
    assert buffer.get_max_priority() == 2.5


@EACH_BUFFER_CLASS
def test_a_buffer_never_bound_to_memory_raises_buffer_closed_from_every_call(cls):
    # The C methods read the table the buffer was bound to: without one they must not run.
    buffer = cls.__new__(cls)
    with pytest.raises(BufferClosed):
        buffer.sample(1)
    with pytest.raises(BufferClosed):
        buffer.add(obs=[0.0, 0.0], act=0)
    if cls is PrioritizedReplayBuffer:
        with pytest.raises(BufferClosed):
            buffer.update_priorities([0], [1.0])


def test_a_python_subclass_overrides_a_per_step_call():
    class Counting(PrioritizedReplayBuffer):
        calls = 0

        def sample(self, *args, **kwargs):
            Counting.calls += 1
            return super().sample(*args, **kwargs)

    buffer = Counting(8, ENV)
    buffer.add(obs=[0.0, 1.0], act=1)
    assert buffer.sample(2)["act"].tolist() == [1, 1] and Counting.calls == 1


@pytest.mark.parametrize(
    "cls, method, parameters",
    [
        (ReplayBuffer, "add", ["self", "priorities", "timeout", "fields"]),
        (ReplayBuffer, "sample", ["self", "batch_size", "beta", "timeout", "out"]),
        (PrioritizedReplayBuffer, "add", ["self", "priorities", "timeout", "fields"]),
        (PrioritizedReplayBuffer, "sample", ["self", "batch_size", "beta", "timeout", "out"]),
        (PrioritizedReplayBuffer, "update_priorities", ["self", "indexes", "priorities"]),
        (MPPrioritizedReplayBuffer, "sample", ["self", "batch_size", "beta", "timeout", "out"]),
    ],
)
def test_the_calls_show_their_parameters_and_documentation(cls, method, parameters):
    function = getattr(cls, method)
    assert list(inspect.signature(function).parameters) == parameters
    assert function.__doc__.strip()


# -- an add of exact arrays: rows, or a compressed writer's steps --------------------------------------

FRAMES = {"obs": {"shape": (6, 5, 4), "dtype": np.uint8}, "act": {"dtype": np.int64}, "done": {"dtype": np.uint8}}
FRAMES["next_obs"] = FRAMES["obs"]
COMPRESSED = {"next_of": "obs", "stack_compress": "obs", "lanes": 2}


def _episode(steps: int, seed: int, channels_first: bool = False) -> dict[str, np.ndarray]:
    """One episode's rows of FRAMES as exact arrays: each stack its step's 4 newest frames (the first
    repeated before it), the next observation the next step's stack, the last step done."""
    frames = np.random.default_rng(seed).integers(0, 256, (steps + 1, 6, 5), dtype=np.uint8)
    back = np.maximum(np.arange(steps + 1)[:, None] + np.arange(-3, 1), 0)  # (step, stack position)
    stacks = frames[back]  # (steps + 1, 4, 6, 5): planar
    stacks = np.moveaxis(stacks, 1, -1) if channels_first else np.ascontiguousarray(np.moveaxis(stacks, 1, -1))
    done = np.zeros(steps, np.uint8)
    done[-1] = 1
    return {"obs": stacks[:-1], "act": np.arange(steps, dtype=np.int64), "done": done, "next_obs": stacks[1:]}


def _buffer(
    compressed: bool, cls: type = PrioritizedReplayBuffer
) -> tuple[PrioritizedReplayBuffer, PrioritizedReplayBuffer]:
    """A buffer of FRAMES and the writer its rows go through (a compressed one's episode writer)."""
    buffer = cls(64, FRAMES, **(COMPRESSED if compressed else {}))
    return buffer, (buffer.episode_writer() if compressed else buffer)


def _stored(buffer: PrioritizedReplayBuffer) -> tuple[dict[str, list], list]:
    stored = buffer.get_stored_size()
    rows = buffer.get_all_transitions()
    return {name: rows[name].tolist() for name in FRAMES}, slot_priorities(buffer).tolist()[:stored]


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, MPPrioritizedReplayBuffer])
@pytest.mark.parametrize("compressed", [False, True], ids=["rows", "compressed"])
@pytest.mark.parametrize("channels_first", [False, True], ids=["c_order", "channels_first"])
def test_batches_of_exact_arrays_store_what_the_same_rows_given_as_lists_store(cls, compressed, channels_first):
    exact, by_kernel = _buffer(compressed, cls)
    converted, by_lists = _buffer(compressed, cls)
    with exact, converted:
        rows = _episode(9, seed=1, channels_first=channels_first)
        for start, stop in [(0, 1), (1, 4), (4, 5), (5, 9)]:
            batch = {name: value[start:stop] for name, value in rows.items()}
            priorities = np.linspace(0.5, 2.0, stop - start) + start
            by_kernel.add(**batch, priorities=priorities, timeout=1.0)
            by_lists.add(**{n: v.tolist() for n, v in batch.items()}, priorities=priorities.tolist(), timeout=1)
        assert _stored(exact) == _stored(converted)


@pytest.mark.parametrize("compressed", [False, True], ids=["rows", "compressed"])
def test_one_float_priority_for_a_batch_of_exact_arrays_is_every_rows_priority(compressed):
    buffer, writer = _buffer(compressed)
    writer.add(**_episode(3, seed=2), priorities=2.5, timeout=0.5)
    assert _stored(buffer)[1] == [2.5, 2.5, 2.5]


@pytest.mark.parametrize("compressed", [False, True], ids=["rows", "compressed"])
@pytest.mark.parametrize("priorities", [np.array([1.0, np.nan, 1.0]), np.array([1.0, -1.0, 1.0]), -2.0])
def test_a_bad_priority_for_a_batch_of_exact_arrays_is_refused_by_name_changing_nothing(
    compressed, priorities, unchanged
):
    buffer, writer = _buffer(compressed)
    rows = _episode(6, seed=3)
    writer.add(**{n: v[:3] for n, v in rows.items()})
    with unchanged(buffer), pytest.raises(ValueError, match="priorities"):
        writer.add(**{n: v[3:] for n, v in rows.items()}, priorities=priorities)


@pytest.mark.parametrize("compressed", [False, True], ids=["rows", "compressed"])
def test_a_bad_timeout_for_a_batch_of_exact_arrays_is_refused_by_name_changing_nothing(compressed, unchanged):
    buffer, writer = _buffer(compressed)
    rows = _episode(6, seed=4)
    writer.add(**{n: v[:3] for n, v in rows.items()})
    with unchanged(buffer), pytest.raises(ValueError, match="timeout"):
        writer.add(**{n: v[3:] for n, v in rows.items()}, priorities=np.ones(3), timeout=-1.0)


def test_a_batch_of_exact_stacks_that_do_not_follow_the_step_before_is_refused_changing_nothing(unchanged):
    buffer, writer = _buffer(compressed=True)
    rows = _episode(6, seed=5)
    writer.add(**{n: v[:3] for n, v in rows.items()})
    later = {n: v[3:].copy() for n, v in rows.items()}
    later["obs"][1, 0, 0, 0] ^= 1  # an older frame of step 4 differs from step 3's
    with unchanged(buffer), pytest.raises(ValueError, match="obs"):
        writer.add(**later, priorities=np.ones(3), timeout=1.0)


@pytest.mark.parametrize("compressed", [False, True], ids=["rows", "compressed"])
def test_an_add_of_exact_arrays_with_priorities_and_a_timeout_runs_no_python_code(compressed):
    _, writer = _buffer(compressed)
    rows = _episode(8, seed=6)
    writer.add(**{n: v[:2] for n, v in rows.items()})  # a compressed writer claims its lane first
    batch, priorities = {n: v[2:6] for n, v in rows.items()}, np.ones(4)
    one = {n: v[6] if v.ndim > 1 else v[6].item() for n, v in rows.items()}  # as an actor passes a step
    called, slots = [], []
    sys.setprofile(lambda frame, event, arg: called.append(frame.f_code.co_qualname) if event == "call" else None)
    try:
        slots.append(writer.add(**batch, priorities=priorities, timeout=1.0))
        slots.append(writer.add(**one, priorities=0.5, timeout=1.0))
    finally:
        sys.setprofile(None)
    assert called == [] and slots == [2, 6]
