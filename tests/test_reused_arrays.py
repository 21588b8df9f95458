"""What ``add`` keeps after it returns, it copied: actors reuse and mutate their arrays.

Real actors preallocate a batch and refill it every step, and roll a frame
stack in place.  The buffers must store exactly what was passed at the call.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EACH_START_METHOD, run_in_child

from mpreplay import MPReplayBuffer, ReplayBuffer

STACK, FRAME = 4, (6, 6)
ENV = {
    "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "next_obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "done": {"dtype": np.uint8},
}
COMPRESSED = {"next_of": "obs", "stack_compress": "obs"}
EPISODES, LENGTH = 3, 23


def _frame(episode: int, t: int) -> np.ndarray:
    return np.full(FRAME, (episode * 50 + t) % 251, dtype=np.uint8)


def _steps():
    """``(obs, next_obs, act, done)`` of every step, as fresh arrays (the reference)."""
    for e in range(EPISODES):
        stack = np.stack([_frame(e, 0)] * STACK, axis=-1)
        for t in range(LENGTH):
            nxt = np.concatenate([stack[..., 1:], _frame(e, t + 1)[..., None]], axis=-1)
            yield stack, nxt, e * 1000 + t, int(t == LENGTH - 1)
            stack = nxt


def _add_reusing_one_step(buffer) -> None:
    # One stack rolled in place, one next-stack buffer refilled: both mutated after every add.
    obs = np.empty(FRAME + (STACK,), np.uint8)
    nxt = np.empty(FRAME + (STACK,), np.uint8)
    for stack, following, act, done in _steps():
        if act % 1000 == 0:
            obs[...] = stack
        nxt[..., :-1] = obs[..., 1:]
        nxt[..., -1] = following[..., -1]
        buffer.add(obs=obs, next_obs=nxt, act=act, done=done)
        obs[..., :-1] = obs[..., 1:]  # roll in place: the array add() saw changes now
        obs[..., -1] = nxt[..., -1]
        nxt.fill(0)


def _add_reusing_a_batch(buffer, batch: int = 8) -> None:
    rows = {
        name: np.zeros((batch,) + spec["shape"], spec["dtype"]) if "shape" in spec else np.zeros(batch, spec["dtype"])
        for name, spec in ENV.items()
    }
    steps = list(_steps())
    for first in range(0, len(steps), batch):
        chunk = steps[first : first + batch]
        for i, (o, n, a, d) in enumerate(chunk):
            rows["obs"][i], rows["next_obs"][i], rows["act"][i], rows["done"][i] = o, n, a, d
        buffer.add(**{name: r[: len(chunk)] for name, r in rows.items()})
        for r in rows.values():
            r.fill(0)  # the actor reuses its batch


def _reference() -> dict[str, np.ndarray]:
    buffer = ReplayBuffer(1024, ENV)
    for o, n, a, d in _steps():
        buffer.add(obs=o.copy(), next_obs=n.copy(), act=a, done=d)
    return buffer.get_all_transitions()


def _assert_stores_the_reference(stored: dict[str, np.ndarray]) -> None:
    expected = _reference()
    order = np.argsort(stored["act"], kind="stable")
    for name in ENV:
        np.testing.assert_array_equal(stored[name][order], expected[name], err_msg=name)


@pytest.mark.parametrize("feed", [_add_reusing_one_step, _add_reusing_a_batch], ids=["one step", "batch"])
def test_a_compressed_buffer_stores_what_was_passed_although_the_arrays_change_after(feed):
    buffer = ReplayBuffer(1024, ENV, **COMPRESSED)
    feed(buffer)
    _assert_stores_the_reference(buffer.get_all_transitions())


@pytest.mark.parametrize("feed", [_add_reusing_one_step, _add_reusing_a_batch], ids=["one step", "batch"])
def test_an_uncompressed_buffer_stores_what_was_passed_although_the_arrays_change_after(feed):
    buffer = ReplayBuffer(1024, ENV)
    feed(buffer)
    _assert_stores_the_reference(buffer.get_all_transitions())


@EACH_START_METHOD
@pytest.mark.parametrize("feed", [_add_reusing_one_step, _add_reusing_a_batch], ids=["one step", "batch"])
@pytest.mark.timeout(120, method="thread")
def test_actor_processes_reusing_their_arrays_fill_a_shared_compressed_buffer(method, feed):
    with MPReplayBuffer(1024, ENV, lanes=2, **COMPRESSED) as buffer:
        assert run_in_child(method, feed, buffer, timeout=60) == 0
        _assert_stores_the_reference(buffer.get_all_transitions())
