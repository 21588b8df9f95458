"""mpreplay: prioritized experience replay in shared memory for multi-process RL."""
from ._version import __version__
from .buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["__version__", "ReplayBuffer", "PrioritizedReplayBuffer"]
