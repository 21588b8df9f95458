"""Exceptions of mpreplay."""


class BufferClosed(RuntimeError):
    """The buffer was closed: its memory is gone, or its owner closed it."""
