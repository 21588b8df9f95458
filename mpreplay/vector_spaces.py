"""A gymnasium environment's spaces as a buffer's fields: ``env_dict``, and the leaves of
(possibly nested) Dict and Tuple spaces through which :mod:`mpreplay.vector_env` takes a vector
env's batched values apart, one array per field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .spec import FieldOptions

__all__ = ["SpaceLeaf", "env_dict", "leaf_value", "per_env_numbers", "space_batch", "space_leaves"]

_FLAG_FIELDS: dict[str, dict[str, Any]] = {"rew": {}, "done": {}}


@dataclass(frozen=True)
class SpaceLeaf:
    """One numeric array of a (possibly nested) space: its field name and where it sits."""

    name: str
    path: tuple[str | int, ...]  # Dict keys and Tuple positions from the top of the space
    shape: tuple[int, ...]
    dtype: np.dtype


def _leaves_of(space: Any, name: str, path: tuple[str | int, ...] = ()) -> list[SpaceLeaf]:
    from gymnasium import spaces

    children: list[tuple[str | int, Any]]  # (key, space): a Dict's names, a Tuple's positions
    if isinstance(space, spaces.Dict):
        children = list(space.spaces.items())
    elif isinstance(space, spaces.Tuple):
        children = list(enumerate(space.spaces))
    elif isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        assert space.shape is not None  # these spaces always have one (gymnasium's Space makes it optional)
        return [SpaceLeaf(name, path, tuple(space.shape), np.dtype(space.dtype))]
    else:
        raise TypeError(
            f"{name}: a {type(space).__name__} space has no fixed-shape numeric fields; expected Box, "
            "Discrete, MultiDiscrete, MultiBinary, or Dict and Tuple spaces of them"
        )
    leaves = []
    for key, child in children:
        field = f"{name}_{key}"
        if not field.isidentifier():
            raise ValueError(
                f"{name}: key {key!r} of a Dict space does not make a field name ({field!r} is not an identifier)"
            )
        leaves += _leaves_of(child, field, path + (key,))
    return leaves


def space_leaves(space: Any, name: str, what: str) -> list[SpaceLeaf]:
    """The numeric arrays of ``space`` (argument ``what``), as fields named from ``name``: ValueError where
    two leaves would make one field name."""
    leaves = _leaves_of(space, name)
    names = [leaf.name for leaf in leaves]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(
            f"{what}: the space flattens to the field name(s) {clash} more than once "
            "(a Dict key with '_' beside a nested Dict or Tuple); rename a key"
        )
    return leaves


def _space_fields(leaves: list[SpaceLeaf]) -> dict[str, dict[str, Any]]:
    return {leaf.name: {"shape": leaf.shape, "dtype": leaf.dtype} for leaf in leaves}


def env_dict(
    observation_space: Any, action_space: Any, *, truncated: bool = False, discount: bool = False
) -> dict[str, FieldOptions]:
    """The ``env_dict`` of the transitions of an environment with these spaces.

    Pass a vector env's ``single_observation_space`` and ``single_action_space``
    (or a single env's spaces).  Fields: ``obs``, ``act``, ``rew``, ``next_obs``,
    ``done`` (float32 flags and rewards), ``truncated`` when asked for, and
    ``discount`` (what n-step folding adds) when asked for.  A Box, Discrete,
    MultiDiscrete or MultiBinary space is one field with its shape and dtype; a
    Dict or Tuple space is one field per leaf, named after its keys or positions:
    ``Dict(image=..., pos=Tuple(a, b))`` observations are the fields ``obs_image``,
    ``obs_pos_0``, ``obs_pos_1`` and ``next_obs_image``, ``next_obs_pos_0``,
    ``next_obs_pos_1`` (so ``next_of="obs_image"`` compresses the image).
    """
    obs = space_leaves(observation_space, "obs", "observation_space")
    act = space_leaves(action_space, "act", "action_space")
    fields = {
        **_space_fields(obs),
        **_space_fields(act),
        **_FLAG_FIELDS,
        **{f"next_{leaf.name}": {"shape": leaf.shape, "dtype": leaf.dtype} for leaf in obs},
    }
    if truncated:
        fields["truncated"] = {}
    if discount:
        fields["discount"] = {}
    return {name: {"shape": f.get("shape", ()), "dtype": f.get("dtype", np.float32)} for name, f in fields.items()}


def leaf_value(value: Any, leaf: SpaceLeaf, what: str) -> Any:
    """The part of ``value`` (argument ``what``, structured as the space) that ``leaf`` names."""
    for key in leaf.path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"{what}: expected the structure of the space, found no {key!r} (for field {leaf.name!r})"
            ) from None
    return value


def space_batch(values: Any, leaves: list[SpaceLeaf], num_envs: int, what: str) -> dict[str, np.ndarray]:
    """Batched values of a space (one row per sub-environment) as one array per field."""
    out = {}
    for leaf in leaves:
        arr = np.asarray(leaf_value(values, leaf, what))
        if arr.shape != (num_envs,) + leaf.shape:
            raise ValueError(f"{what}: field {leaf.name!r} expected shape {(num_envs,) + leaf.shape}, got {arr.shape}")
        out[leaf.name] = arr
    return out


def per_env_numbers(name: str, values: Any, num_envs: int) -> np.ndarray:
    """``values`` (argument ``name``): one number per sub-environment, else ValueError."""
    arr = np.asarray(values)
    if arr.shape != (num_envs,) or arr.dtype.kind not in "biuf":
        raise ValueError(
            f"{name}: expected {num_envs} numbers (one per sub-environment), got {arr.dtype} of shape {arr.shape}"
        )
    return arr
