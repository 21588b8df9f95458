"""Bad input to a local buffer's calls raises a clear exception naming the argument and what was
expected, and changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import (
    EACH_BUFFER_CLASS,
    NUMBERED_FIELDS,
    numbered_row,
    numbered_transitions,
    slot_priorities,
    wrapped_buffer,
)

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer

ENV = NUMBERED_FIELDS


def _without(row: dict, name: str) -> dict:
    return {k: v for k, v in row.items() if k != name}


def _with(rows: dict, **changes) -> dict:
    return {**rows, **changes}


def _bad_last_row(k: int, name: str, value) -> dict:
    """A batch of k good rows but for field ``name`` of the last one (the whole batch must be refused)."""
    rows = numbered_transitions(range(k))
    column = rows[name].astype(np.result_type(rows[name], np.asarray(value)))
    column[-1] = value
    return {**rows, name: column}


_BAD_FOR_ANY_BUFFER = [
    pytest.param(lambda b: b.add(**numbered_row(0), extra=1.0), ValueError, "'extra'", id="add-unknown-field"),
    pytest.param(lambda b: b.add(**_without(numbered_row(0), "act")), ValueError, "'act'", id="add-missing-field"),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), obs=np.zeros(2))), ValueError, "'obs'", id="add-wrong-shape"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), obs=np.zeros((2, 4)))),
        ValueError,
        "'obs'",
        id="add-batch-wrong-row-shape",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=[1.0, 2.0])), ValueError, "'obs'", id="add-list-of-wrong-length"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=[[1.0, 2.0, 3.0], [1.0, 2.0]])),
        ValueError,
        "'obs'",
        id="add-ragged-list",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), act=1.5)), TypeError, "'act'", id="add-float-into-int-field"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), act=np.array([1.0, 2.0]))),
        TypeError,
        "'act'",
        id="add-float-array-into-int-field",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), done=256)), ValueError, "'done'", id="add-int-above-uint8"),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), done=-1)), ValueError, "'done'", id="add-negative-into-uint8"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), done=np.int8(-1))),
        ValueError,
        "'done'",
        id="add-negative-int8-into-uint8",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), act=np.uint64(2**63))),
        ValueError,
        "'act'",
        id="add-uint64-above-int64-range",
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), rew=1e300)), ValueError, "'rew'", id="add-float-overflowing-float32"
    ),
    pytest.param(
        lambda b: b.add(**_with(numbered_row(0), obs=np.array([0.0, 1e300, 2.0]))),
        ValueError,
        "'obs'",
        id="add-float64-row-overflowing-float32",
    ),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), rew="high")), TypeError, "'rew'", id="add-string-value"),
    pytest.param(lambda b: b.add(**_with(numbered_row(0), rew=None)), TypeError, "'rew'", id="add-none-value"),
    pytest.param(
        lambda b: b.add(**_with(numbered_transitions(range(2)), act=np.arange(3))),
        ValueError,
        "'act'",
        id="add-batch-lengths-disagree",
    ),
    pytest.param(
        lambda b: b.add(**_bad_last_row(6, "done", 300)), ValueError, "'done'", id="add-wrapping-batch-bad-last-row"
    ),
    pytest.param(
        lambda b: b.add(**_bad_last_row(20, "act", 0.5)), TypeError, "'act'", id="add-oversized-batch-bad-last-row"
    ),
    pytest.param(lambda b: b.sample(0), ValueError, "batch_size", id="sample-batch-size-zero"),
    pytest.param(lambda b: b.sample(-3), ValueError, "batch_size", id="sample-batch-size-negative"),
    pytest.param(lambda b: b.sample(2.5), ValueError, "batch_size", id="sample-batch-size-float"),
    pytest.param(lambda b: b.sample(True), ValueError, "batch_size", id="sample-batch-size-bool"),
    pytest.param(lambda b: b.sample(None), ValueError, "batch_size", id="sample-batch-size-none"),
    pytest.param(lambda b: b.sample(2, timeout=-1.0), ValueError, "timeout", id="sample-timeout-negative"),
    pytest.param(lambda b: b.sample(2, timeout=math.inf), ValueError, "timeout", id="sample-timeout-inf"),
    pytest.param(lambda b: b.add(**numbered_row(0), timeout=math.nan), ValueError, "timeout", id="add-timeout-nan"),
    pytest.param(lambda b: b.add(**numbered_row(0), timeout="1"), TypeError, "timeout", id="add-timeout-string"),
]


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("call, error, field", _BAD_FOR_ANY_BUFFER)
def test_bad_input_raises_naming_the_field_and_changes_nothing(cls, call, error, field, unchanged):
    buffer = wrapped_buffer(cls)
    with unchanged(buffer), pytest.raises(error, match=field):
        call(buffer)


@EACH_BUFFER_CLASS
def test_a_float64_row_into_a_float32_field_is_stored_rounded_to_float32(cls):
    buffer = cls(4, ENV)
    obs = np.array([0.1, -np.inf, np.nan])
    buffer.add(**_with(numbered_row(0), obs=obs))
    assert buffer.get_all_transitions()["obs"][0].tobytes() == obs.astype(np.float32).tobytes()


@pytest.mark.parametrize(
    "value, error", [(256, ValueError), (-1, ValueError), (1.5, TypeError)], ids=["too-large", "negative", "fractional"]
)
def test_a_number_that_does_not_fit_a_field_of_shape_one_is_refused_and_changes_nothing(value, error, unchanged):
    buffer = ReplayBuffer(8, {"act": {"shape": 1, "dtype": np.uint8}})
    buffer.add(act=3)
    with unchanged(buffer), pytest.raises(error, match="act"):
        buffer.add(act=value)
    np.testing.assert_array_equal(buffer.get_all_transitions()["act"], [[3]])


def test_complex_values_are_refused_in_a_float_field(unchanged):
    buffer = ReplayBuffer(8, ENV)
    with unchanged(buffer), pytest.raises(TypeError, match="rew"):
        buffer.add(obs=np.zeros(3), act=1, rew=1j, done=0)


@EACH_BUFFER_CLASS
def test_sample_from_an_empty_buffer_raises_and_changes_nothing(cls, unchanged):
    buffer = cls(4, ENV, seed=0)
    with unchanged(buffer), pytest.raises(ValueError, match="no transition"):
        buffer.sample(1)


@EACH_BUFFER_CLASS
def test_sample_rejects_an_out_array_of_the_wrong_shape(cls):
    buffer = wrapped_buffer(cls)
    with pytest.raises(ValueError, match=r"out\['obs'\]"):
        buffer.sample(4, out={"obs": np.zeros((3, 3), np.float32)})


_BAD_OUT = [
    pytest.param(np.zeros((4, 3), np.float64), id="wrong-dtype"),
    pytest.param(np.zeros((3, 4), np.float32).T, id="not-c-contiguous"),
    pytest.param(np.zeros((4, 3), np.float32)[::-1], id="negative-strides"),
    pytest.param(np.broadcast_to(np.zeros(3, np.float32), (4, 3)), id="read-only"),
    pytest.param([[0.0] * 3] * 4, id="a-list"),
]


@EACH_BUFFER_CLASS
@pytest.mark.parametrize("array", _BAD_OUT)
def test_sample_rejects_an_out_array_it_cannot_fill_and_changes_nothing(cls, array, unchanged):
    buffer = wrapped_buffer(cls)
    with unchanged(buffer), pytest.raises(ValueError, match=r"out\['obs'\]: expected a writable C-contiguous"):
        buffer.sample(4, out={"obs": array})


def test_uniform_buffer_refuses_priorities(unchanged):
    buffer = wrapped_buffer(ReplayBuffer)
    with unchanged(buffer), pytest.raises(TypeError, match="priorities"):
        buffer.add(**numbered_row(0), priorities=1.0)


def test_uniform_buffer_refuses_a_beta_and_a_priority_update(unchanged):
    buffer = wrapped_buffer(ReplayBuffer)
    batch = buffer.sample(2)
    with unchanged(buffer), pytest.raises(TypeError, match="beta: only a table whose selector draws by priority"):
        buffer.sample(2, 0.4)
    with unchanged(buffer), pytest.raises(TypeError, match="update_priorities: this table's selector draws by no"):
        buffer.update_priorities(batch["indexes"], np.ones(2))


_BAD_FOR_PRIORITIZED_BUFFER = [
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=math.nan), ValueError, "priorities", id="add-nan-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=math.inf), ValueError, "priorities", id="add-inf-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities=-0.5), ValueError, "priorities", id="add-negative-priority"
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(3)), priorities=[1.0, 2.0]),
        ValueError,
        "priorities",
        id="add-too-few-priorities",
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(2)), priorities=[[1.0, 2.0], [3.0, 4.0]]),
        ValueError,
        "priorities",
        id="add-priorities-2d-too-many",
    ),
    pytest.param(
        lambda b: b.add(**numbered_row(0), priorities="high"), TypeError, "priorities", id="add-priority-string"
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(6)), priorities=[1.0] * 5 + [math.nan]),
        ValueError,
        "priorities",
        id="add-wrapping-batch-bad-last-priority",
    ),
    pytest.param(
        lambda b: b.add(**numbered_transitions(range(20)), priorities=[1.0] * 19 + [-1.0]),
        ValueError,
        "priorities",
        id="add-oversized-batch-bad-last-priority",
    ),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0, math.nan]), ValueError, "priorities", id="update-nan"),
    pytest.param(lambda b: b.update_priorities([0, 1], [math.inf, 1.0]), ValueError, "priorities", id="update-inf"),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0, -1.0]), ValueError, "priorities", id="update-negative"),
    pytest.param(lambda b: b.update_priorities([0, 1], [1.0]), ValueError, "priorities", id="update-too-few"),
    pytest.param(
        lambda b: b.update_priorities([0, 1], [1.0, 2.0, 3.0]), ValueError, "priorities", id="update-too-many"
    ),
    pytest.param(lambda b: b.update_priorities([0, 8], [1.0, 2.0]), ValueError, "indexes", id="update-index-capacity"),
    pytest.param(lambda b: b.update_priorities([-1], [1.0]), ValueError, "indexes", id="update-index-negative"),
    pytest.param(lambda b: b.update_priorities([2**40], [1.0]), ValueError, "indexes", id="update-index-huge"),
    pytest.param(
        lambda b: b.update_priorities([0.0, 1.5], [1.0, 2.0]), ValueError, "indexes", id="update-fractional-index"
    ),
    pytest.param(lambda b: b.update_priorities([[0, 1]], [1.0, 2.0]), ValueError, "indexes", id="update-index-2d"),
    # The int64 and float64 arrays sample() hands out take a path of their own: the same refusals.
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0, math.nan])),
        ValueError,
        "priorities",
        id="update-arrays-nan",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0, -1.0])),
        ValueError,
        "priorities",
        id="update-arrays-negative",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 1]), np.array([1.0])),
        ValueError,
        "priorities",
        id="update-arrays-too-few",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([0, 8]), np.array([1.0, 2.0])),
        ValueError,
        "indexes",
        id="update-arrays-index-capacity",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([-1, 0]), np.array([1.0, math.nan])),
        ValueError,
        "indexes",
        id="update-arrays-bad-index-before-bad-priority",
    ),
    pytest.param(
        lambda b: b.update_priorities(np.array([[0, 1]]), np.array([1.0, 2.0])),
        ValueError,
        "indexes",
        id="update-arrays-index-2d",
    ),
    pytest.param(lambda b: b.sample(2, beta=-0.1), ValueError, "beta", id="sample-beta-negative"),
    pytest.param(lambda b: b.sample(2, beta=math.nan), ValueError, "beta", id="sample-beta-nan"),
    pytest.param(lambda b: b.sample(2, beta=math.inf), ValueError, "beta", id="sample-beta-inf"),
    pytest.param(
        lambda b: b.sample(2, beta=2.0),
        ValueError,
        r"beta: expected a finite number in \[0, 1\], got 2.0",
        id="sample-beta-above-one",
    ),
    pytest.param(lambda b: b.sample(2, beta="high"), (TypeError, ValueError), "beta", id="sample-beta-string"),
]


@pytest.mark.parametrize("call, error, field", _BAD_FOR_PRIORITIZED_BUFFER)
def test_bad_input_to_a_prioritized_buffer_raises_naming_the_argument_and_changes_nothing(
    call, error, field, unchanged
):
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    with unchanged(buffer), pytest.raises(error, match=field):
        call(buffer)


@pytest.mark.parametrize("priority", [-1.0, math.nan, math.inf], ids=["negative", "nan", "inf"])
def test_a_bad_single_float_priority_is_refused_and_changes_nothing(priority, unchanged):
    buffer = PrioritizedReplayBuffer(8, ENV)
    with unchanged(buffer), pytest.raises(ValueError, match="priorities"):
        buffer.add(obs=np.zeros(3, np.float32), act=1, rew=0.5, done=0, priorities=priority)


def test_update_of_a_slot_not_stored_yet_raises_and_changes_nothing(unchanged):
    buffer = PrioritizedReplayBuffer(8, ENV)
    buffer.add(**numbered_transitions(range(3)))
    with unchanged(buffer), pytest.raises(ValueError, match="indexes"):
        buffer.update_priorities([3], [1.0])


def test_a_uint64_index_of_2_to_the_63_or_more_is_refused_as_given():
    buffer = wrapped_buffer(PrioritizedReplayBuffer)
    before = slot_priorities(buffer)
    with pytest.raises(ValueError, match=f"indexes: expected slots .* got {2**63 + 1} at position 1"):
        buffer.update_priorities(np.array([0, 2**63 + 1], dtype=np.uint64), np.array([5.0, 5.0]))
    np.testing.assert_array_equal(slot_priorities(buffer), before)
