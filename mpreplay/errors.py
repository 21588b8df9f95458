"""Exceptions and warnings of mpreplay."""

import os
import sys
import warnings

from ._ext.gate import BufferClosed, TableGone  # raised by the kernels too: defined where they can reach them
from .memory import SharedMemoryError

__all__ = [
    "BufferClosed",
    "CheckpointError",
    "CorruptBufferError",
    "IncompatibleSegmentError",
    "ReadOnlyError",
    "RowsDroppedWarning",
    "TableGone",
]


class IncompatibleSegmentError(SharedMemoryError):
    """A handle refused to attach: the segment's manifest does not describe the layout this
    process computes for the buffer (another mpreplay version made it, another configuration,
    or its manifest is damaged).  The message names both mpreplay versions and the first
    entry that differs."""


class CorruptBufferError(RuntimeError):
    """``verify()`` found a buffer whose derived state disagrees with its slot states
    (a damaged segment, or a defect).  ``problems`` lists every disagreement found, each
    naming the array or counter and where; the message lists them too."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"the buffer is inconsistent ({len(self.problems)} problems): " + "; ".join(self.problems))


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored: no manifest, a damaged or truncated file (a chunk
    whose checksum does not match), another format version, or a configuration whose layout
    is not the one recorded.  The message names the file and, for data, the array and chunk."""


class RowsDroppedWarning(UserWarning):
    """One write (an ``add`` of a batch, a ``load_transitions``) brought more rows than the table
    holds: it kept the newest, as the same rows added one by one would have left it, and dropped
    the others.  The message says how many.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from mpreplay import ReplayBuffer, RowsDroppedWarning
    >>> rb = ReplayBuffer(4, {"x": {}})
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always", RowsDroppedWarning)
    ...     _ = rb.add(x=np.arange(6.0))
    >>> print(caught[0].message)
    6 rows written at once into a table of 4 slots: it keeps the newest 4, the 2 oldest were dropped
    >>> rb.get_all_transitions()["x"].tolist()
    [2.0, 3.0, 4.0, 5.0]
    """


def warn_rows_dropped(given: int, kept: int) -> None:
    """Warn, at the first line of the caller's code outside mpreplay, that a write of ``given``
    rows kept the newest ``kept``."""
    package, frame, level = os.path.dirname(__file__), sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"{given} rows written at once into a table of {kept} slots: it keeps the newest {kept}, "
        f"the {given - kept} oldest were dropped",
        RowsDroppedWarning,
        stacklevel=level,
    )


class ReadOnlyError(RuntimeError):
    """A handle attached read-only (``mpreplay.attach(name, readonly=True)``) was asked to write:
    ``add``, ``update_priorities``, ``clear``, ``on_episode_end``, ``load_transitions``, an
    episode writer, or removing the table.  The table is unchanged."""


def read_only(call: str) -> ReadOnlyError:
    """The error a read-only handle's ``call`` raises."""
    return ReadOnlyError(
        f"{call}: this handle was attached read-only (mpreplay.attach(name, readonly=True)); it samples, "
        "reads and inspects the table but never changes it: attach without readonly to write"
    )
