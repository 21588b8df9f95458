"""How a sharded index packs a shard's id, a slot's generation tag and the slot into one int64.

Bits 52-62 hold the shard's id in its client, bits 32-51 the low 20 bits of the slot's write
count when it was sampled (its *generation tag*), bits 0-31 the slot.  A shard server sees only
the low 52 bits, its *key*: tag and slot.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MAX_SHARD_IDS",
    "MAX_SLOTS",
    "key_of",
    "keys_valid",
    "shard_index",
    "split_index",
    "split_indexes",
    "split_keys",
    "tags_match",
]

_SLOT_BITS, _TAG_BITS, _SHARD_BITS = 32, 20, 11
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_TAG_MASK = (1 << _TAG_BITS) - 1
_KEY_BITS = _SLOT_BITS + _TAG_BITS
_KEY_MASK = (1 << _KEY_BITS) - 1
MAX_SLOTS = _SLOT_MASK + 1  # the largest capacity a shard may have
MAX_SHARD_IDS = 1 << _SHARD_BITS  # ids one client can hand out


def key_of(tags: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The keys of ``slots`` sampled at write counts ``tags`` (only their low 20 bits are kept)."""
    return ((tags & _TAG_MASK) << _SLOT_BITS) | slots


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tags, slots)`` of int64 ``keys``."""
    return keys >> _SLOT_BITS, keys & _SLOT_MASK


def keys_valid(keys: np.ndarray) -> np.ndarray:
    """Where ``keys`` are something :func:`key_of` can have made."""
    return (keys >= 0) & (keys <= _KEY_MASK)


def tags_match(current: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    """Where a slot's current write count (-1: being written) still has the tag it was sampled with."""
    return (current >= 0) & ((current & _TAG_MASK) == sampled)


def shard_index(shard: int, keys: np.ndarray) -> np.ndarray:
    """The indexes a client hands out for ``keys`` of shard ``shard``."""
    return (np.int64(shard) << _KEY_BITS) | keys


def split_index(indexes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard_ids, keys)`` of int64 ``indexes``."""
    return indexes >> _KEY_BITS, indexes & _KEY_MASK


def split_indexes(indexes: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard_ids, slots, generation_tags)`` of indexes a :class:`ShardedReplay` returned.

    A generation tag is the low 20 bits of how many times the slot had been
    written when it was sampled.
    """
    shards, keys = split_index(np.asarray(indexes, dtype=np.int64))
    tags, slots = split_keys(keys)
    return shards, slots, tags
