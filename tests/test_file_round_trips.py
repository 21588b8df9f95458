"""A compressed buffer's own file loads into an empty buffer of the same configuration as the same
transitions, whatever folded its rows n steps ahead and whether its last episode had ended."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import damage  # tests/damage.py: transitions files taken apart and put together
import numpy as np
import pytest
from helpers import saved_file

from mpreplay import NstepBuffer, ReplayBuffer
from mpreplay.fileformat import TransitionFileError
from mpreplay.vector_env import DISABLED, VectorTransitions

FRAME = (8, 8)
STACK = 4
NSTEP = 3
GAMMA = 0.9
SIZE = 64
LENGTHS = (11, 14)  # the steps of the two episodes played, in turn
# How many steps of the second episode are played: all, or fewer and it stays open -- with more rows
# than NSTEP (so the last NSTEP rows' next observations lie past the last row), or with fewer (every
# row's does).
PLAYED = {"episodes ended": 14, "one still open": 12, "one open with fewer rows than n": 7}
ENV = {
    "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "act": {"dtype": np.int64},
    "rew": {},
    "next_obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "done": {},
}
COMPRESSIONS = {
    "next_of": {"next_of": "obs"},
    "stack": {"stack_compress": "obs"},
    "both": {"next_of": "obs", "stack_compress": "obs"},
}


def _stacks(episode: int, n: int) -> np.ndarray:
    """The n + 1 observations of an episode of n steps: each the one before shifted by a new frame
    (stack axis last), the first frame repeated at the start."""
    frames = np.random.default_rng([episode, n]).integers(0, 256, size=(n + 1,) + FRAME, dtype=np.uint8)
    newest = np.maximum(np.arange(n + 1)[:, None] + np.arange(1 - STACK, 1), 0)
    return np.ascontiguousarray(np.moveaxis(frames[newest], 1, -1))


def _steps(ending: str) -> Iterator[dict[str, Any]]:
    """The steps played, one at a time: two episodes, the second as ``ending`` says."""
    for e, n in enumerate(LENGTHS):
        stacks = _stacks(e, n)
        for t in range(n if e < len(LENGTHS) - 1 else PLAYED[ending]):
            yield {"obs": stacks[t], "act": t % 4, "rew": 0.5 * t + e, "next_obs": stacks[t + 1], "done": t == n - 1}


# -- what folds the rows: each returns the buffer it filled and how to make an empty one like it --
Filled = tuple[ReplayBuffer, Callable[[], ReplayBuffer]]


def _unfolded(options: dict[str, Any], ending: str) -> Filled:
    def make() -> ReplayBuffer:
        return ReplayBuffer(SIZE, ENV, **options)

    rb = make()
    for step in _steps(ending):
        rb.add(**step)
    return rb, make


def _folded_by_the_buffer(options: dict[str, Any], ending: str) -> Filled:
    def make() -> ReplayBuffer:
        return ReplayBuffer(SIZE, ENV, nstep={"size": NSTEP, "gamma": GAMMA}, **options)

    rb = make()
    for step in _steps(ending):
        rb.add(**step)
    return rb, make


def _folded_by_an_nstep_buffer(options: dict[str, Any], ending: str) -> Filled:
    folder = NstepBuffer(ENV, NSTEP, GAMMA)

    def make() -> ReplayBuffer:
        return ReplayBuffer(SIZE, folder.output_env_dict(), **options)

    rb = make()
    for step in _steps(ending):
        rows = folder.add(**step)
        if len(rows["obs"]):
            rb.add(**rows)
    return rb, make


def _folded_by_a_vector_actor(options: dict[str, Any], ending: str) -> Filled:
    spaces = pytest.importorskip("gymnasium").spaces
    env = SimpleNamespace(  # VectorTransitions reads a vector env's spaces, never steps it
        num_envs=1,
        single_observation_space=spaces.Box(0, 255, FRAME + (STACK,), np.uint8),
        single_action_space=spaces.Discrete(4),
        metadata={"autoreset_mode": DISABLED},
    )
    actor = VectorTransitions(env, nstep=NSTEP, gamma=GAMMA)

    def make() -> ReplayBuffer:
        return ReplayBuffer(SIZE, actor.env_dict(), **options)

    rb = make()
    first = True
    for step in _steps(ending):
        if first:
            actor.reset(step["obs"][None], mask=np.ones(1, bool))
        batch = actor.step([step["act"]], step["next_obs"][None], [step["rew"]], [step["done"]], [False])
        if len(batch):
            rb.add(**batch.rows)
        first = bool(step["done"])
    return rb, make


FOLDERS = {
    "unfolded": _unfolded,
    "buffer nstep=": _folded_by_the_buffer,
    "NstepBuffer": _folded_by_an_nstep_buffer,
    "VectorTransitions": _folded_by_a_vector_actor,
}


@pytest.mark.parametrize("ending", list(PLAYED))
@pytest.mark.parametrize("compression", list(COMPRESSIONS))
@pytest.mark.parametrize("folder", list(FOLDERS))
def test_a_buffers_file_loads_back_as_the_same_transitions(folder, compression, ending):
    rb, make = FOLDERS[folder](COMPRESSIONS[compression], ending)
    saved = rb.get_all_transitions()
    assert len(saved["obs"]) > 0
    loaded = make()
    loaded.load_transitions(saved_file(rb))
    back = loaded.get_all_transitions()
    assert back.keys() == saved.keys()
    for name in saved:
        assert (back[name].dtype, back[name].shape) == (saved[name].dtype, saved[name].shape), name
        assert back[name].tobytes() == saved[name].tobytes(), name


def test_an_open_episodes_next_observation_that_does_not_continue_the_stack_is_refused():
    rb, make = _folded_by_the_buffer(COMPRESSIONS["both"], "one still open")
    members = damage.file_members(saved_file(rb))
    members["next_obs"][-1, 0, 0, 0] ^= 1  # an older frame of a next observation no row holds
    loaded = make()
    with pytest.raises(TransitionFileError, match="field 'next_obs': a next observation no row of the episode holds"):
        loaded.load_transitions(damage.file_archive(members))
    assert loaded.get_stored_size() == 0
