"""cpprb's ``cpprb.PyReplayBuffer`` module: where cpprb programs import ``NstepBuffer``
and the buffer classes from."""

from .arrays import dict2buffer
from .buffers import (
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReverseReplayBuffer,
    create_buffer,
)
from .nstep import NstepBuffer
from .selective import SelectiveReplayBuffer
from .training import train

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "ReverseReplayBuffer",
    "SelectiveReplayBuffer",
    "NstepBuffer",
    "create_buffer",
    "dict2buffer",
    "train",
]
