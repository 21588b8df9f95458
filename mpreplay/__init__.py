"""mpreplay: prioritized experience replay in shared memory for multi-process RL."""
from ._version import __version__
from .buffer import BufferClosed, MPPrioritizedReplayBuffer, MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from .memory import SharedMemoryError

__all__ = [
    "__version__",
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "BufferClosed",
    "SharedMemoryError",
]
