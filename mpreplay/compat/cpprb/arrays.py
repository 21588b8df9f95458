"""cpprb's ``dict2buffer``: the arrays of an ``env_dict``, as cpprb lays them out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ... import checks
from .fields import option_names

__all__ = ["dict2buffer"]


def dict2buffer(
    buffer_size: Any,
    env_dict: Mapping[str, Mapping[str, Any]],
    *,
    stack_compress: Any = None,
    default_dtype: Any = None,
    mmap_prefix: str | None = None,
    shared: Any = None,
    ctx: Any = None,
) -> dict[str, np.ndarray]:
    """One array of ``(buffer_size, *shape)`` per field, filled with ones (as cpprb fills them).

    A ``stack_compress`` field is a strided view in which row ``i`` shares all but one
    frame with row ``i + 1``: ``buffer_size + stack - 1`` frames back ``buffer_size``
    stacks.  ``mmap_prefix`` maps each array to the file ``<prefix>_<name>.dat``.
    Unlike cpprb's, ``env_dict`` is left unchanged.  cpprb's process-shared arrays
    (``shared=``) are not provided: mpreplay's ``MPReplayBuffer`` shares whole buffers.
    """
    if shared is not None:
        raise ValueError("shared: cpprb's process-shared arrays are not provided; use MPReplayBuffer")
    size = checks.capacity("buffer_size", buffer_size)
    stacked = set(option_names("stack_compress", stack_compress))
    default = np.single if default_dtype is None else default_dtype
    out = {}
    for name, options in env_dict.items():
        shape = tuple(np.array(options.get("shape", 1), ndmin=1).tolist())
        dtype = np.dtype(options.get("dtype", default))
        if name in stacked:
            frames = _zeros(mmap_prefix, name, (size + shape[-1] - 1,) + shape[:-1], dtype)
            step = frames.strides[0]
            out[name] = np.lib.stride_tricks.as_strided(
                frames, shape=(size,) + shape, strides=(step,) + frames.strides[1:] + (step,)
            )
        else:
            out[name] = _zeros(mmap_prefix, name, (size,) + shape, dtype)
        out[name][:] = 1
    return out


def _zeros(mmap_prefix: str | None, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if mmap_prefix:
        return np.memmap(f"{mmap_prefix}_{name}.dat", shape=shape, dtype=dtype, mode="w+")
    return np.zeros(shape, dtype=dtype)
