"""Exceptions of mpreplay."""

from ._ext.gate import BufferClosed, TableGone  # raised by the kernels too: defined where they can reach them
from .memory import SharedMemoryError

__all__ = ["BufferClosed", "CorruptBufferError", "IncompatibleSegmentError", "ReadOnlyError", "TableGone"]


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
