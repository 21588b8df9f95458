"""Deprecated since 0.3.0 (removed without warning in 0.2.0), removed in 0.4.0: the module is
:mod:`mpreplay.compression`; its ``FrameWriter`` is ``FrameStore``."""

from . import deprecated
from .compression import Compression, with_next_fields
from .frame_store import FrameStore

FrameWriter = FrameStore

__all__ = ["Compression", "FrameWriter", "with_next_fields"]

deprecated.moved("mpreplay.storage", "mpreplay.compression")
