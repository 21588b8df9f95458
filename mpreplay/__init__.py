"""mpreplay: prioritized experience replay in shared memory for multi-process RL."""
from ._version import __version__
from .buffer import MPPrioritizedReplayBuffer, MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from .errors import BufferClosed
from .limiter import MinSize, RateLimiter, SampleToInsertRatio
from .memory import SharedMemoryError
from .nstep import NstepBuffer

__all__ = [
    "__version__",
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "BufferClosed",
    "SharedMemoryError",
    "RateLimiter",
    "MinSize",
    "SampleToInsertRatio",
    "NstepBuffer",
]
