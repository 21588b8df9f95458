"""Buffers that fold n steps themselves (``nstep=``; cpprb's ``Nstep=`` is the compat layer's)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import EACH_BUFFER_CLASS, EACH_START_METHOD, run_in_child, transition_fields

from mpreplay import MPPrioritizedReplayBuffer, NstepBuffer, PrioritizedReplayBuffer, ReplayBuffer

ENV = transition_fields((2,))


def _episode(length: int, start: int = 0, terminal: bool = True) -> list[dict]:
    return [
        dict(
            obs=np.full(2, start + t, np.float32),
            act=start + t,
            rew=float(t + 1),
            next_obs=np.full(2, start + t + 1, np.float32),
            done=float(terminal and t == length - 1),
        )
        for t in range(length)
    ]


def _play(buffer, steps: list[dict]) -> None:
    for step in steps:
        buffer.add(**step)


@EACH_BUFFER_CLASS
def test_a_folding_buffer_stores_what_an_nstep_buffer_emits(cls):
    steps = _episode(7) + _episode(4, start=100, terminal=False)
    buffer = cls(64, ENV, nstep={"size": 3, "gamma": 0.9})
    _play(buffer, steps)
    buffer.on_episode_end()

    folder = NstepBuffer(ENV, 3, 0.9)
    reference = ReplayBuffer(64, {**ENV, "discount": {}})
    for step in steps:
        reference.add(**folder.add(**step))
    reference.add(**folder.on_episode_end())

    got, want = buffer.get_all_transitions(), reference.get_all_transitions()
    assert set(got) == set(want) == set(ENV) | {"discount"}
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_dict_in_cpprbs_nstep_form_is_accepted():
    buffer = ReplayBuffer(16, ENV, nstep={"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"})
    _play(buffer, _episode(3))
    stored = buffer.get_all_transitions()
    np.testing.assert_allclose(stored["rew"], [1 + 0.5 * 2, 2 + 0.5 * 3, 3])
    np.testing.assert_allclose(stored["discount"], [0.25, 0.25, 0.5])


def test_steps_are_held_back_until_n_are_known():
    buffer = ReplayBuffer(16, ENV, nstep={"size": 3})
    assert buffer.add(**_episode(5, terminal=False)[0]) == -1  # no row stored: no slot
    assert buffer.get_stored_size() == 0


def test_the_add_that_completes_a_row_returns_the_slot_it_stored_it_in():
    buffer = ReplayBuffer(16, ENV, nstep={"size": 2})
    first, second, _ = _episode(3, terminal=False)
    assert (buffer.add(**first), buffer.add(**second)) == (-1, 0)


def test_on_episode_end_stores_the_pending_steps_as_bootstrapping():
    buffer = ReplayBuffer(16, ENV, nstep={"size": 4, "gamma": 1.0})
    _play(buffer, _episode(2, terminal=False))
    assert buffer.get_stored_size() == 0
    buffer.on_episode_end()
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["done"], [0, 0])
    np.testing.assert_allclose(stored["rew"], [3, 2])


def test_clear_also_drops_pending_steps():
    buffer = ReplayBuffer(16, ENV, nstep={"size": 3})
    _play(buffer, _episode(2, terminal=False))
    buffer.clear()
    buffer.on_episode_end()
    assert buffer.get_stored_size() == 0


def _stored_priorities(buffer) -> np.ndarray:
    """Raw priorities of the stored rows, oldest first, as a saved file holds them."""
    f = io.BytesIO()
    buffer.save_transitions(f, priorities=True)
    f.seek(0)
    return np.load(f, allow_pickle=False)["priorities"]


def test_a_folded_row_keeps_the_priority_given_with_its_first_step():
    buffer = PrioritizedReplayBuffer(16, ENV, nstep={"size": 3, "gamma": 0.9})
    for t, step in enumerate(_episode(5)):
        buffer.add(priorities=float(t + 1), **step)
    np.testing.assert_array_equal(buffer.get_all_transitions()["act"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(_stored_priorities(buffer), [1, 2, 3, 4, 5])


def test_a_folded_row_without_priority_gets_the_largest_stored_when_it_is_stored():
    buffer = PrioritizedReplayBuffer(16, ENV, nstep={"size": 2, "gamma": 0.9})
    steps = _episode(4)
    buffer.add(priorities=3.0, **steps[0])
    buffer.add(**steps[1])
    buffer.add(priorities=0.5, **steps[2])
    buffer.add(priorities=0.25, **steps[3])
    np.testing.assert_array_equal(_stored_priorities(buffer), [3, 3, 0.5, 0.25])


def test_a_bad_priority_leaves_the_folders_as_they_were(unchanged):
    buffer = PrioritizedReplayBuffer(16, ENV, nstep={"size": 2, "gamma": 0.9})
    steps = _episode(3)
    buffer.add(**steps[0])
    with unchanged(buffer):
        with pytest.raises(ValueError, match="priorities"):
            buffer.add(priorities=-1.0, **steps[1])
        with pytest.raises(ValueError, match="priorities"):
            buffer.add(priorities=[1.0, 2.0], **steps[1])
    buffer.add(**steps[1])
    buffer.add(**steps[2])
    np.testing.assert_array_equal(buffer.get_all_transitions()["act"], [0, 1, 2])


def test_consecutive_steps_in_one_add_fold_as_single_adds():
    steps = _episode(6)
    one_by_one = ReplayBuffer(16, ENV, nstep={"size": 3, "gamma": 0.9})
    _play(one_by_one, steps)
    batched = ReplayBuffer(16, ENV, nstep={"size": 3, "gamma": 0.9})
    batched.add(**{name: np.stack([np.asarray(s[name]) for s in steps]) for name in ENV})
    got, want = batched.get_all_transitions(), one_by_one.get_all_transitions()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_nstep_names_may_be_lists():
    env = {**ENV, "rew2": {}}
    buffer = ReplayBuffer(16, env, nstep={"size": 2, "gamma": 0.5, "rew": ["rew", "rew2"], "next": ["next_obs"]})
    for step in _episode(3):
        buffer.add(rew2=2 * step["rew"], **step)
    stored = buffer.get_all_transitions()
    np.testing.assert_allclose(stored["rew"], [1 + 0.5 * 2, 2 + 0.5 * 3, 3])
    np.testing.assert_allclose(stored["rew2"], [2 + 0.5 * 4, 4 + 0.5 * 6, 6])


def test_without_a_reward_field_only_the_flags_and_next_observations_move():
    buffer = ReplayBuffer(16, {"obs": {}, "next_obs": {}, "done": {}}, nstep={"size": 2})
    for t in range(3):
        buffer.add(obs=t, next_obs=t + 1, done=float(t == 2))
    stored = buffer.get_all_transitions()
    np.testing.assert_array_equal(stored["next_obs"], [2, 3, 3])
    np.testing.assert_array_equal(stored["done"], [0, 1, 1])


@pytest.mark.parametrize(
    "options, error",
    [
        pytest.param({"gamma": 0.9}, TypeError, id="missing-size"),
        pytest.param({"size": 3, "lambda": 0.9}, ValueError, id="unknown-key"),
        pytest.param({"size": 0}, ValueError, id="size-zero"),
        pytest.param({"size": 3, "gamma": 1.5}, ValueError, id="gamma-above-one"),
        pytest.param({"size": 3, "rew": "reward"}, ValueError, id="unknown-reward-field"),
    ],
)
def test_bad_nstep_settings_are_rejected(options, error):
    with pytest.raises(error, match=r"nstep|size|gamma|rew|reward"):
        ReplayBuffer(16, ENV, nstep=options)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer, MPPrioritizedReplayBuffer])
def test_cpprbs_nstep_spelling_is_refused_naming_the_native_one(cls):
    with pytest.raises(TypeError, match=r"Nstep: mpreplay's buffers take nstep= .*mpreplay\.compat\.cpprb"):
        cls(16, ENV, Nstep={"size": 2})


def _fold_in_child(buffer) -> None:
    _play(buffer, _episode(5))


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_each_process_of_a_shared_buffer_folds_its_own_steps(method):
    with MPPrioritizedReplayBuffer(64, ENV, nstep={"size": 2, "gamma": 0.5}) as buffer:
        _play(buffer, _episode(3, start=1000, terminal=False))  # stores 1000, 1001; 1002 stays pending here
        assert run_in_child(method, _fold_in_child, buffer) == 0
        stored = buffer.get_all_transitions()
        np.testing.assert_array_equal(stored["act"], [1000, 1001, 0, 1, 2, 3, 4])
        np.testing.assert_allclose(stored["rew"][2:], [2, 3.5, 5, 6.5, 5])
