"""``mpreplay.compat.cpprb``'s gymnasium helpers (skipped without gymnasium, as cpprb has none then)."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay.compat import cpprb

gym = pytest.importorskip("gymnasium")


def _space_env(observation_space, action_space):
    env = type("SpaceEnv", (), {})()
    env.observation_space, env.action_space = observation_space, action_space
    return env


@pytest.mark.parametrize(
    "observation_space, action_space",
    [
        (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)),
        (gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2,))]), gym.spaces.MultiDiscrete([2, 3])),
        (gym.spaces.Dict({"pos": gym.spaces.Box(0, 1, (2,))}), gym.spaces.MultiBinary(3)),
    ],
    ids=["box-discrete", "tuple-multidiscrete", "dict-multibinary"],
)
def test_create_env_dict_and_before_add_func_make_a_step_a_buffer_takes(observation_space, action_space):
    env = _space_env(observation_space, action_space)
    buffer = cpprb.ReplayBuffer(8, cpprb.create_env_dict(env))
    before_add = cpprb.create_before_add_func(env)
    obs = observation_space.sample()
    buffer.add(**before_add(obs, action_space.sample(), observation_space.sample(), 0.5, False))
    assert buffer.get_stored_size() == 1


def test_create_env_dict_gives_discrete_spaces_an_integer_column():
    env_dict = cpprb.create_env_dict(_space_env(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)))
    assert env_dict["act"] == {"dtype": np.int32, "shape": 1}
    assert env_dict["obs"] == env_dict["next_obs"] == {"dtype": np.float32, "shape": (4,)}
