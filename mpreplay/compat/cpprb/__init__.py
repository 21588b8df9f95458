"""cpprb 11's API over mpreplay's buffers: ``from mpreplay.compat import cpprb``.

A program written for cpprb changes its import line and nothing else::

    from mpreplay.compat.cpprb import PrioritizedReplayBuffer   # was: from cpprb import ...

The classes keep cpprb's shapes (``(batch, 1)`` scalar fields), dtypes
(``weights`` float32, ``indexes`` uint64) and rules (running maximum
priority, ``Nstep`` timing, unknown ``add`` keys ignored), and store
everything in mpreplay's buffers: their speed, whole rows only, crash-safe
shared memory, stale priority updates dropped.  The documentation's "Coming
from cpprb" page (docs/cpprb.md) lists every difference.  cpprb itself is never imported.
"""

from . import HER, LaBER, PyReplayBuffer, multiprocessing  # noqa: F401 -- cpprb's submodules, as cpprb.HER etc.
from .buffers import (
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReverseReplayBuffer,
    create_buffer,
)
from .HER import HindsightReplayBuffer
from .LaBER import LaBERlazy, LaBERmax, LaBERmean
from .nstep import NstepBuffer
from .selective import SelectiveReplayBuffer
from .training import train

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "SelectiveReplayBuffer",
    "ReverseReplayBuffer",
    "LaBERmean",
    "LaBERlazy",
    "LaBERmax",
    "HindsightReplayBuffer",
    "NstepBuffer",
    "create_buffer",
    "train",
]

try:  # as in cpprb, these exist when gymnasium (or gym) is installed
    from .util import create_before_add_func, create_env_dict
except ImportError:
    pass
else:
    __all__ += ["create_env_dict", "create_before_add_func"]
