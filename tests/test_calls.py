"""Specification of the buffers' per-step calls (ext/calls.pyx): add, sample and
update_priorities go straight into the table for the usual call, and every other call
behaves as the buffer's Python methods and argument checks say."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from helpers import EACH_BUFFER_CLASS

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
