"""Deprecated since 0.3.0, removed in 0.4.0: import the buffers from :mod:`mpreplay`."""

from . import deprecated
from .buffers import MPPrioritizedReplayBuffer, MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from .errors import BufferClosed

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer", "MPPrioritizedReplayBuffer", "BufferClosed"]

deprecated.moved("mpreplay.buffer", "from mpreplay import ReplayBuffer, PrioritizedReplayBuffer, ...")
