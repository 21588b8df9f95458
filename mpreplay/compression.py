"""Memory compression: ``next_of`` and ``stack_compress``.

``next_of=("obs",)`` stores each observation once: a transition's
``next_obs`` is read from the slot of the transition whose ``obs`` it
equals -- usually the next one in the lane -- and the last ``next_obs`` of
an episode takes one slot of its own (a lone frame, never sampled).
``stack_compress=("obs",)`` stores only the newest frame of a stacked
observation (last axis = stack) and rebuilds the stack from the frames
before it, repeating the episode's first frame at its start.

Nothing is trusted: every ``next_obs`` is matched byte for byte against the
observation it will be rebuilt from, and every stack against the frames it
will be rebuilt from, so a sample is bit-identical to what an uncompressed
buffer would return.  A transition stays unsampleable (WAITING) until the
frame of its next observation is stored, and is retired as soon as a frame
it reads is overwritten.

This module holds the configuration (:class:`Compression`); each writer's
:class:`~mpreplay.frame_store.FrameStore` writes the frames.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checks
from ._ext.frames import Frames
from ._ext.schema import (
    DEPTH_ARRAY,
    LANE_CURSOR,
    LANE_END,
    LANE_OWNER,
    LANE_START,
    LANES_ARRAY,
    NEXT_ARRAY,
    frames_array,
)
from .spec import FieldSpec

__all__ = ["MAX_NEXT", "Compression", "with_next_fields"]

MAX_NEXT = 16  # at most this many slots between a transition and its next observation


def _keys(name: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    keys = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(k, str) for k in keys):
        raise TypeError(f"{name}: expected a field name or a list of them, got {value!r}")
    return keys


def with_next_fields(specs: Mapping[str, FieldSpec], next_of: Any) -> dict[str, FieldSpec]:
    """``specs`` plus ``next_<key>`` for every ``next_of`` key it lacks (cpprb's
    env_dict names only ``obs``; samples still carry ``next_obs``)."""
    out = dict(specs)
    for key in _keys("next_of", next_of):
        if key in out and f"next_{key}" not in out:
            out[f"next_{key}"] = FieldSpec(f"next_{key}", out[key].shape, out[key].dtype)
    return out


@dataclass(frozen=True)
class Compression:
    """Which fields are stored compressed, and how episodes are delimited."""

    next_of: tuple[str, ...]
    stack: tuple[str, ...]
    lanes: int
    done: str | None
    truncated: str | None

    @classmethod
    def build(
        cls,
        specs: Mapping[str, FieldSpec],
        next_of: Any,
        stack_compress: Any,
        lanes: Any,
        done: str | None,
        truncated: str | None,
        *,
        in_lanes: bool = False,
    ) -> Compression | None:
        """Check the options against the field specs (``specs`` includes ``next_<key>``).

        ``in_lanes``: the buffer keeps each writer's episodes in a lane of its own even
        without compressed keys (a sequence buffer's steps must be consecutive)."""
        next_keys, stack_keys = _keys("next_of", next_of), _keys("stack_compress", stack_compress)
        lanes = checks.integer("lanes", lanes, low=1)
        if not next_keys and not stack_keys and not in_lanes:
            if lanes != 1:
                raise ValueError("lanes: only compressed buffers (next_of, stack_compress) have several lanes")
            return None
        for key in next_keys + stack_keys:
            if key not in specs:
                raise ValueError(f"next_of/stack_compress: unknown field {key!r}; expected one of {list(specs)}")
        for key in next_keys:
            nxt = specs.get(f"next_{key}")
            if nxt is None or (nxt.shape, nxt.dtype) != (specs[key].shape, specs[key].dtype):
                raise ValueError(f"next_of: field 'next_{key}' must exist with the shape and dtype of {key!r}")
        for key in stack_keys:
            if not specs[key].shape or specs[key].shape[-1] < 2:
                raise ValueError(f"stack_compress: field {key!r} needs a stack axis (last) of at least 2 frames")
        for flag in (done, truncated):
            if flag is not None and (flag not in specs or specs[flag].shape not in ((), (1,))):
                raise ValueError(f"episode flag {flag!r}: expected a scalar field of the env_dict")
        return cls(next_keys, stack_keys, int(lanes), done, truncated)

    @property
    def keys(self) -> tuple[str, ...]:
        """The compressed observation keys, each stored as frames."""
        return tuple(dict.fromkeys(self.next_of + self.stack))

    def stored_fields(self, specs: Mapping[str, FieldSpec]) -> list[str]:
        """Fields stored as plain per-slot arrays."""
        frames = set(self.keys) | {f"next_{k}" for k in self.next_of}
        return [name for name in specs if name not in frames]

    def stack_of(self, key: str, specs: Mapping[str, FieldSpec]) -> int:
        return specs[key].shape[-1] if key in self.stack else 1

    def frame_shape(self, key: str, specs: Mapping[str, FieldSpec]) -> tuple[int, ...]:
        return specs[key].shape[:-1] if key in self.stack else specs[key].shape

    def lane_bounds(self, size: int, lanes: np.ndarray) -> None:
        """Lay ``size`` slots out as equal lanes in ``lanes`` (the last takes the rest), each empty."""
        width = size // self.lanes
        if self.keys and width < 2 * MAX_NEXT:
            raise ValueError(
                f"lanes: {self.lanes} lanes leave {width} slots each; "
                f"a compressed buffer needs at least {2 * MAX_NEXT} per lane"
            )
        starts = np.arange(self.lanes) * width
        lanes[:, LANE_START] = lanes[:, LANE_CURSOR] = starts
        lanes[:, LANE_END] = np.append(starts[1:], size)
        lanes[:, LANE_OWNER] = 0

    def make_frames(self, specs: Mapping[str, FieldSpec], arrays: Mapping[str, np.ndarray]) -> tuple[Frames, list]:
        """The Frames kernel over ``arrays`` and the sample outputs it rebuilds."""
        stores, outputs = [], []
        for i, key in enumerate(self.keys):
            stores.append((arrays[frames_array(key)], self.stack_of(key, specs), key in self.next_of))
            outputs.append((key, i, False, specs[key].shape, specs[key].dtype))
            if key in self.next_of:
                outputs.append((f"next_{key}", i, True, specs[key].shape, specs[key].dtype))
        frames = Frames(arrays[NEXT_ARRAY], arrays[DEPTH_ARRAY], arrays[LANES_ARRAY], stores, MAX_NEXT)
        return frames, outputs
