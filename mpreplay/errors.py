"""Exceptions of mpreplay."""
from ._ext.gate import BufferClosed  # raised by the kernels too: defined where they can reach it

__all__ = ["BufferClosed"]
