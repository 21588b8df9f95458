"""cpprb's gymnasium helpers: an ``env_dict`` from an environment's spaces, and the
function that lays a step out as that ``env_dict``'s fields.

Works with gymnasium (or, failing that, gym) spaces; importing this module
needs one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple
except ImportError:  # cpprb also takes gym's spaces
    from gym.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple  # type: ignore[no-redef]

__all__ = ["create_env_dict", "create_before_add_func"]


def _field(space: Any, int_type: Any, float_type: Any) -> dict[str, Any]:
    if isinstance(space, Discrete):
        return {"dtype": int_type, "shape": 1}
    if isinstance(space, MultiDiscrete):
        return {"dtype": int_type, "shape": space.nvec.shape}
    if isinstance(space, Box):
        return {"dtype": float_type, "shape": space.shape}
    if isinstance(space, MultiBinary):
        return {"dtype": int_type, "shape": space.n}
    raise NotImplementedError(f"create_env_dict: no field for the space {space!r}")


def _names(role: str, space: Any) -> Callable[[Any], dict[str, Any]]:
    """How a value of ``space`` in ``role`` ("obs", "next_obs" or "act") splits into fields:
    a Tuple into ``<role>0``, ``<role>1``, ...; a Dict into its keys (``next_<key>`` for
    next observations); anything else is the field ``<role>`` itself."""
    if isinstance(space, Tuple):
        return lambda value: {f"{role}{i}": v for i, v in enumerate(value)}
    if isinstance(space, Dict):
        prefix = "next_" if role == "next_obs" else ""
        return lambda value: {f"{prefix}{key}": v for key, v in value.items()}
    return lambda value: {role: value}


def _spaces(role: str, space: Any) -> dict[str, Any]:
    """The fields of ``space`` in ``role``, each with its own space."""
    parts = space.spaces if isinstance(space, (Tuple, Dict)) else space
    return _names(role, space)(parts)


def create_env_dict(env: Any, *, int_type: Any = None, float_type: Any = None) -> dict[str, dict[str, Any]]:
    """The ``env_dict`` of ``env``'s observation and action spaces (cpprb's layout: ``obs``,
    ``next_obs``, ``act``, with ``rew`` and ``done`` of shape 1; a Tuple space gives
    ``obs0``, ``obs1``, ...; a Dict space one field per key, ``next_<key>`` for next
    observations).

    ``int_type`` (int32) and ``float_type`` (float32) are the dtypes of discrete and
    continuous spaces.
    """
    int_type = int_type or np.int32
    float_type = float_type or np.float32
    env_dict = {"rew": {"shape": 1, "dtype": float_type}, "done": {"shape": 1, "dtype": float_type}}
    for role, space in (("obs", env.observation_space), ("next_obs", env.observation_space), ("act", env.action_space)):
        env_dict.update({name: _field(s, int_type, float_type) for name, s in _spaces(role, space).items()})
    return env_dict


def create_before_add_func(env: Any) -> Callable[..., dict[str, Any]]:
    """A function ``before_add(obs, act, next_obs, rew, done)`` returning the keyword
    arguments of ``add`` for the fields :func:`create_env_dict` makes of ``env``."""
    obs, next_obs = _names("obs", env.observation_space), _names("next_obs", env.observation_space)
    act = _names("act", env.action_space)

    def before_add(obs_: Any, act_: Any, next_obs_: Any, rew: Any, done: Any) -> dict[str, Any]:
        return {**obs(obs_), **act(act_), **next_obs(next_obs_), "rew": rew, "done": done}

    return before_add
