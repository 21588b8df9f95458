"""A compressed add checks every stack and next observation byte for byte, for any dtype, stack
depth and memory layout: one changed byte anywhere is refused, naming the field (and the row),
and the buffer is left exactly as it was; what is accepted samples back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay import ReplayBuffer

# 5 * 3 elements: the byte count of a stack is no multiple of 8 for most dtypes and depths,
# so the checks' last bytes are compared one by one too.
FRAME = (5, 3)
DTYPES = [np.uint8, np.int16, np.float32, np.float64]
STACKS = [2, 3, 4, 5]
BOTH = {"next_of": "obs", "stack_compress": "obs"}
# How an actor holds its stacks: C order (stack axis last), or channels first seen through
# np.moveaxis (each frame contiguous), as a FrameStack wrapper's output usually is.
LAYOUTS = ["stack last", "channels first"]


def _frames(count: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.floating):
        return rng.normal(size=(count,) + FRAME).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (count,) + FRAME, dtype=dtype, endpoint=True)


def _stacks(frames: np.ndarray, stack: int) -> np.ndarray:
    """Observation t stacks frames t - stack + 1 .. t (the first frame repeated before the start)."""
    t = np.arange(len(frames))[:, None] + np.arange(1 - stack, 1)[None, :]
    return np.ascontiguousarray(np.moveaxis(frames[np.maximum(t, 0)], 1, -1))


def _in_layout(stacks: np.ndarray, layout: str) -> np.ndarray:
    """A copy of ``stacks`` (stack axis last) held in ``layout``."""
    if layout == "stack last":
        return stacks.copy()
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(stacks, -1, 1)), 1, -1)


def _episode(length: int, dtype, stack: int, seed: int = 0, layout: str = "stack last") -> dict[str, np.ndarray]:
    """The steps of one episode ending with done, as a batch: obs, next_obs, id, done."""
    stacks = _stacks(_frames(length + 1, dtype, seed), stack)
    done = np.zeros(length)
    done[-1] = 1
    return {
        "obs": _in_layout(stacks[:-1], layout),
        "next_obs": _in_layout(stacks[1:], layout),
        "id": np.arange(length),
        "done": done,
    }


def _buffer(dtype, stack: int, **options) -> ReplayBuffer:
    obs = {"shape": FRAME + (stack,), "dtype": dtype}
    return ReplayBuffer(64, {"obs": obs, "next_obs": obs, "id": {"dtype": np.int64}, "done": {}}, **(options or BOTH))


def _rows(steps: dict[str, np.ndarray], rows: slice) -> dict[str, np.ndarray]:
    return {name: values[rows] for name, values in steps.items()}


def _flip_byte(array: np.ndarray, element: int, position: int, byte: int) -> None:
    """Flip one bit of byte ``byte`` of stack position ``position`` of the element-th element."""
    index = np.unravel_index(element, FRAME) + (position,)
    value = np.array(array[index])
    value.reshape(1).view(np.uint8)[byte] ^= 0x10
    array[index] = value


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stacks_of_any_dtype_depth_and_layout_sample_back_bit_for_bit(dtype, stack, layout):
    buffer = _buffer(dtype, stack)
    steps = _episode(12, dtype, stack, layout=layout)
    buffer.add(**_rows(steps, slice(0, 5)))  # within a call and across calls
    for t in range(5, 12):
        buffer.add(**_rows(steps, slice(t, t + 1)))
    stored = buffer.get_all_transitions()
    order = np.argsort(stored["id"])
    assert stored["id"][order].tolist() == list(range(12))
    for name in ("obs", "next_obs"):
        assert stored[name][order].tobytes() == steps[name].tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("within_call", [True, False], ids=["same call", "next call"])
@pytest.mark.parametrize("place", ["oldest, first byte", "just older than newest, last byte"])
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_changed_byte_of_an_older_frame_is_refused(dtype, stack, place, within_call, layout, unchanged):
    buffer = _buffer(dtype, stack)
    steps = _episode(6, dtype, stack, layout=layout)
    element, position, byte = (
        (0, 0, 0) if place.startswith("oldest") else (FRAME[0] * FRAME[1] - 1, stack - 2, np.dtype(dtype).itemsize - 1)
    )
    _flip_byte(steps["obs"][3], element, position, byte)
    if within_call:
        with unchanged(buffer), pytest.raises(ValueError, match="field 'obs': row 3 is not the previous observation"):
            buffer.add(**_rows(steps, slice(0, 6)))
    else:
        buffer.add(**_rows(steps, slice(0, 3)))
        with unchanged(buffer), pytest.raises(ValueError, match="field 'obs': row 0 is not the previous observation"):
            buffer.add(**_rows(steps, slice(3, 6)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_first_step_must_repeat_its_frame_in_every_position(dtype, stack, layout, unchanged):
    buffer = _buffer(dtype, stack)
    steps = _episode(3, dtype, stack, layout=layout)
    _flip_byte(steps["obs"][0], FRAME[0] * FRAME[1] - 1, 0, 0)
    with unchanged(buffer), pytest.raises(ValueError, match=r"field 'obs': row 0 .*first frame of an episode"):
        buffer.add(**steps)


def test_zeros_of_opposite_signs_are_different_frames(unchanged):
    # Equal as numbers, not as bytes: a sample rebuilt from the stored frame would differ.
    buffer = _buffer(np.float32, 2)
    steps = _episode(3, np.float32, 2)
    steps["obs"][1][0, 0, 0], steps["obs"][0][0, 0, 1] = -0.0, 0.0
    steps["obs"][0][0, 0, 0] = steps["next_obs"][0][0, 0, 0] = 0.0
    with unchanged(buffer), pytest.raises(ValueError, match="field 'obs': row 1"):
        buffer.add(**steps)


def test_frames_holding_nan_are_stored_and_sampled_back_bit_for_bit():
    buffer = _buffer(np.float64, 3)
    frames = _frames(5, np.float64, 1)
    frames[2, 1, 1] = np.nan
    stacks = _stacks(frames, 3)
    buffer.add(obs=stacks[:-1], next_obs=stacks[1:], id=np.arange(4), done=np.array([0, 0, 0, 1.0]))
    stored = buffer.get_all_transitions()
    order = np.argsort(stored["id"])
    assert stored["obs"][order].tobytes() == stacks[:-1].tobytes()
    assert stored["next_obs"][order].tobytes() == stacks[1:].tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_next_observation_with_one_changed_byte_matches_no_observation(dtype, layout, unchanged):
    buffer = _buffer(dtype, 4, next_of="obs")
    steps = _episode(4, dtype, 4, layout=layout)
    _flip_byte(steps["next_obs"][1], 7, 2, 0)
    with unchanged(buffer), pytest.raises(ValueError, match="field 'next_obs': a next observation of this episode"):
        buffer.add(**steps)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_last_next_observation_that_does_not_continue_the_stack_is_refused(dtype, layout, unchanged):
    buffer = _buffer(dtype, 4)
    steps = _episode(4, dtype, 4, layout=layout)
    _flip_byte(steps["next_obs"][3], 0, 1, 0)
    with unchanged(buffer), pytest.raises(ValueError, match="field 'next_obs': the episode's last next observation"):
        buffer.add(**steps)


@pytest.mark.parametrize("stack", [2, 3])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_a_writer_may_change_layouts_between_calls_and_within_a_row(dtype, stack):
    buffer = _buffer(dtype, stack)
    steps = _episode(9, dtype, stack)
    channels_first = _episode(9, dtype, stack, layout="channels first")
    mixed = {**steps, "next_obs": channels_first["next_obs"]}  # obs in one layout, next_obs in the other
    for rows, source in [
        (slice(0, 3), steps),
        (slice(3, 6), channels_first),
        (slice(6, 8), mixed),
        (slice(8, 9), steps),
    ]:
        buffer.add(**_rows(source, rows))
    stored = buffer.get_all_transitions()
    order = np.argsort(stored["id"])
    for name in ("obs", "next_obs"):
        assert stored[name][order].tobytes() == steps[name].tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_changed_byte_is_refused_when_layouts_differ_between_calls(layout, unchanged):
    buffer = _buffer(np.uint8, 4)
    other = "channels first" if layout == "stack last" else "stack last"
    first, second = _episode(6, np.uint8, 4, layout=layout), _episode(6, np.uint8, 4, layout=other)
    buffer.add(**_rows(first, slice(0, 3)))
    _flip_byte(second["obs"][3], 10, 1, 0)
    with unchanged(buffer), pytest.raises(ValueError, match="field 'obs': row 0 is not the previous observation"):
        buffer.add(**_rows(second, slice(3, 6)))


# -- one step per add: an actor's usual call, stored by the kernel from the call to the publication --
def _step(steps: dict[str, np.ndarray], t: int) -> dict:
    """Step t as an actor passes it: its observations as they are held, id and done as Python numbers."""
    return {
        "obs": steps["obs"][t],
        "next_obs": steps["next_obs"][t],
        "id": int(steps["id"][t]),
        "done": float(steps["done"][t]),
    }


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_steps_added_one_per_call_sample_back_bit_for_bit(dtype, stack, layout):
    buffer = _buffer(dtype, stack)
    first, second = _episode(5, dtype, stack, seed=1, layout=layout), _episode(4, dtype, stack, seed=2, layout=layout)
    second["id"] += 5
    for steps in (first, second):
        for t in range(len(steps["id"])):
            buffer.add(**_step(steps, t))
    stored = buffer.get_all_transitions()
    order = np.argsort(stored["id"])
    assert stored["id"][order].tolist() == list(range(9))
    for name in ("obs", "next_obs"):
        assert stored[name][order].tobytes() == np.concatenate([first[name], second[name]]).tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("place", ["oldest, first byte", "just older than newest, last byte"])
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_changed_byte_of_an_older_frame_of_a_one_step_add_is_refused(dtype, stack, place, layout, unchanged):
    buffer = _buffer(dtype, stack)
    steps = _episode(6, dtype, stack, layout=layout)
    element, position, byte = (
        (0, 0, 0) if place.startswith("oldest") else (FRAME[0] * FRAME[1] - 1, stack - 2, np.dtype(dtype).itemsize - 1)
    )
    for t in range(3):
        buffer.add(**_step(steps, t))
    good = steps["obs"][3].copy()
    _flip_byte(steps["obs"][3], element, position, byte)
    with unchanged(buffer), pytest.raises(ValueError, match="field 'obs': row 0 is not the previous observation"):
        buffer.add(**_step(steps, 3))
    steps["obs"][3] = good  # the refused step left the episode where it was: the right one continues it
    for t in range(3, 6):
        buffer.add(**_step(steps, t))
    assert np.sort(buffer.get_all_transitions()["id"]).tolist() == list(range(6))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_first_step_added_alone_must_repeat_its_frame_in_every_position(dtype, layout, unchanged):
    buffer = _buffer(dtype, 4)
    steps = _episode(3, dtype, 4, layout=layout)
    _flip_byte(steps["obs"][0], FRAME[0] * FRAME[1] - 1, 0, 0)
    with unchanged(buffer), pytest.raises(ValueError, match=r"field 'obs': row 0 .*first frame of an episode"):
        buffer.add(**_step(steps, 0))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_one_step_next_observation_with_one_changed_byte_is_refused_at_its_episode_end(dtype, layout, unchanged):
    buffer = _buffer(dtype, 4)
    steps = _episode(4, dtype, 4, layout=layout)
    _flip_byte(steps["next_obs"][1], 7, 2, 0)
    for t in range(3):
        buffer.add(**_step(steps, t))  # row 1 waits for an observation equal to its next one
    assert buffer.get_all_transitions()["id"].tolist() == [0]  # ... and so does row 2, behind it
    with unchanged(buffer), pytest.raises(ValueError, match="field 'next_obs': a next observation of this episode"):
        buffer.add(**_step(steps, 3))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_last_next_observation_added_alone_that_does_not_continue_the_stack_is_refused(dtype, layout, unchanged):
    buffer = _buffer(dtype, 4)
    steps = _episode(4, dtype, 4, layout=layout)
    _flip_byte(steps["next_obs"][3], 0, 1, 0)
    for t in range(3):
        buffer.add(**_step(steps, t))
    with unchanged(buffer), pytest.raises(ValueError, match="field 'next_obs': the episode's last next observation"):
        buffer.add(**_step(steps, 3))


def test_one_step_adds_mix_with_adds_of_values_numpy_converts():
    # Lists, numpy scalars and batches of one take the general path; the episode continues across both.
    buffer = _buffer(np.uint8, 4)
    steps = _episode(8, np.uint8, 4)
    converted = [
        {**_step(steps, 1), "obs": steps["obs"][1].tolist()},
        {**_step(steps, 3), "id": np.int32(3)},
        _rows(steps, slice(5, 6)),
    ]
    for t in range(8):
        buffer.add(**(converted.pop(0) if t in (1, 3, 5) else _step(steps, t)))
    stored = buffer.get_all_transitions()
    order = np.argsort(stored["id"])
    assert stored["id"][order].tolist() == list(range(8))
    for name in ("obs", "next_obs"):
        assert stored[name][order].tobytes() == steps[name].tobytes()
