"""Exceptions of mpreplay."""
from ._ext.gate import BufferClosed  # raised by the kernels too: defined where they can reach it
from .memory import SharedMemoryError

__all__ = ["BufferClosed", "IncompatibleSegmentError"]


class IncompatibleSegmentError(SharedMemoryError):
    """A handle refused to attach: the segment's manifest does not describe the layout this
    process computes for the buffer (another mpreplay version made it, another configuration,
    or its manifest is damaged).  The message names both mpreplay versions and the first
    entry that differs."""
