# Types of the compiled module built from ext/gate.pyx (keep the two in step).
import numpy as np
from typing_extensions import disjoint_base

from .lock import SharedLock, ThreadLock

class BufferClosed(RuntimeError):
    """The buffer was closed: its memory is gone, or its owner closed it."""

class TableGone(BufferClosed):
    """The table ended under this handle: its creator died and it was not persistent, or it was removed."""

def ended_error(why: int) -> BufferClosed:
    """The exception a call raises on a table whose header says it ended ``why`` (ENDED_*)."""

def deadline(timeout: float | None) -> float:
    """The ``time.monotonic()`` moment a ``timeout`` in seconds ends (None: never, inf)."""

@disjoint_base  # a Cython extension type: no class can derive from it and another such type
class Gate:
    """The lock of ``header``'s table and the rate limiter set in ``limits``."""

    def __init__(self, header: np.ndarray, limits: np.ndarray, lock: SharedLock | ThreadLock) -> None: ...
    def forget_lock(self) -> None: ...
    def hold(self, deadline: float = ...) -> None: ...
    def let_go(self) -> None: ...
    def close(self, why: int = ...) -> None: ...
