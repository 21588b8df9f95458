"""Exceptions of mpreplay."""

from ._ext.gate import BufferClosed  # raised by the kernels too: defined where they can reach it
from .memory import SharedMemoryError

__all__ = ["BufferClosed", "CheckpointError", "CorruptBufferError", "IncompatibleSegmentError"]


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
