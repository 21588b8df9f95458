"""Deprecated since 0.3.0, removed in 0.4.0: import the sequence buffers from :mod:`mpreplay`."""

from . import deprecated
from .buffers import (
    MPPrioritizedSequenceReplayBuffer,
    MPSequenceReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    SequenceReplayBuffer,
)

__all__ = [
    "SequenceReplayBuffer",
    "PrioritizedSequenceReplayBuffer",
    "MPSequenceReplayBuffer",
    "MPPrioritizedSequenceReplayBuffer",
]

deprecated.moved("mpreplay.sequence_buffer", "from mpreplay import SequenceReplayBuffer, ...")
