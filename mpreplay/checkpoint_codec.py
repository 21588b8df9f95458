"""How a checkpoint's chunks are stored in ``data.bin``: as they are, or deflated.

A chunk is a piece of one array (at most 16 MB).  Its manifest record is ``[nbytes, crc32,
at, stored]``: the array's bytes it holds, the CRC-32 of those bytes (as the table's memory
holds them, whatever the storage: the sum checks what a restore puts in the new table, and
is the same sum a raw checkpoint records), and where its stored bytes lie in ``data.bin``
and how many.  Raw (:class:`RawChunks`), a chunk is its bytes at the array's place in the
file, ``stored == nbytes``.  Deflated (:class:`DeflatedChunks`, ``checkpoint(compress=True)``),
a chunk is one raw deflate stream (RFC 1951, no header, no checksum of its own: the chunk's
CRC-32 is the check), the streams one after the other in the order written.

Deflate is ISA-L's (``isal.isal_zlib``, the ``checkpoint`` extra: 5-10 times zlib's speed at
its fastest level) where it is installed, zlib's otherwise -- the streams are the same format,
either inflates what the other deflated (:func:`deflate`, :func:`inflate`).  Both release the
GIL: chunks are deflated on :data:`THREADS` threads while the checkpoint's thread copies the
next block and writes the ones done, in order.
"""

from __future__ import annotations

import collections
import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .writeback import Writeback

try:  # ISA-L's CRC-32: zlib's sums, 5-10x faster (the checkpoint extra)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the checkpoint extra is not installed
    from zlib import crc32

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "FEED",
    "LEVELS",
    "STEP",
    "THREADS",
    "DeflatedChunks",
    "RawChunks",
    "crc32",
    "deflate",
    "inflate",
    "inflate_into",
    "pwrite",
]


def _installed() -> dict[str, Any]:
    try:  # ISA-L's deflate: zlib's streams, several times faster (the checkpoint extra)
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - the checkpoint extra is not installed
        return {"zlib": zlib}
    return {"isal": isal_zlib, "zlib": zlib}


# The deflate implementations installed, by name: ISA-L's (when the isal package is) and zlib's.
CODECS = _installed()
DEFAULT_CODEC = next(iter(CODECS))
# Each implementation's fastest level: on Breakout frames ISA-L's 1 deflates about 1 GB/s a core
# to about a 50th (its 0 is as fast and a third larger); zlib's 1 about 70 MB/s a core.
LEVELS = {"isal": 1, "zlib": 1}
THREADS = max(1, min(4, os.cpu_count() or 1))  # chunks deflated or inflated at once
_RAW_DEFLATE = -15  # wbits: a raw deflate stream (a 32 KB window, no zlib header or trailer)
STEP = 2**20  # bytes deflated or inflated per call: a piece the cache holds while it is summed and copied
FEED = 2**16  # deflated bytes given to one call of inflating (what it leaves is copied: kept small)


def _codec(using: str | None) -> tuple[str, Any]:
    name = DEFAULT_CODEC if using is None else using
    if name not in CODECS:
        raise ValueError(f"using: expected one of the deflate implementations installed {tuple(CODECS)}, got {using!r}")
    return name, CODECS[name]


def deflate(data: Any, *, using: str | None = None) -> bytes:
    """``data`` (bytes-like) as one raw deflate stream, by ``using`` (a name of :data:`CODECS`;
    None: ISA-L's where installed, else zlib's) at its fastest level."""
    return _summed_deflate(memoryview(data).cast("B"), using)[1]


def _summed_deflate(data: memoryview, using: str | None) -> tuple[int, bytes]:
    """``data``'s CRC-32 and its raw deflate stream, both taken a STEP at a time (each step
    summed and deflated while the cache holds it)."""
    name, module = _codec(using)
    compressor = module.compressobj(LEVELS[name], zlib.DEFLATED, _RAW_DEFLATE)
    crc, parts = 0, []
    for a in range(0, data.nbytes, STEP):
        step = data[a : a + STEP]
        crc = crc32(step, crc)
        parts.append(compressor.compress(step))
    parts.append(compressor.flush())
    return crc, b"".join(parts)


def inflate(data: Any, nbytes: int, *, using: str | None = None) -> bytes:
    """The ``nbytes`` bytes the raw deflate stream ``data`` holds, by ``using`` (as in
    :func:`deflate`); ValueError as :func:`inflate_into` raises it."""
    out = np.empty(nbytes, dtype=np.uint8)
    inflate_into(data, out, using=using)
    return out.tobytes()


def inflate_into(data: Any, out: np.ndarray, *, using: str | None = None) -> int:
    """Inflate the raw deflate stream ``data`` into ``out`` (uint8, 1-D), fed FEED bytes and
    inflated at most STEP bytes at a time (each step copied and summed while the cache holds
    it; what a call leaves of its input is copied, so it is kept small); the CRC-32 of the
    bytes.  ValueError where ``data`` is not exactly one whole stream of ``out.size`` bytes
    (damaged, cut short, longer, or followed by other bytes); ``out`` may then hold part of it."""
    _, module = _codec(using)
    inflater = module.decompressobj(_RAW_DEFLATE)
    view = memoryview(data).cast("B")
    crc, a, i, longer = 0, 0, 0, False
    tail: bytes | memoryview = b""  # input given and not yet inflated
    try:
        while not inflater.eof and (tail or i < view.nbytes):
            if not tail:
                tail, i = view[i : i + FEED], i + FEED
            # Past out's end, one byte more is asked for: a stream that holds more shows.
            step = inflater.decompress(tail, min(STEP, out.size - a) or 1)
            tail = inflater.unconsumed_tail
            if a + len(step) > out.size:
                longer = True
                break
            out[a : a + len(step)] = np.frombuffer(step, dtype=np.uint8)
            crc = crc32(step, crc)
            a += len(step)
    except Exception as exc:  # zlib.error, isal's IsalError: bytes that are not deflate
        raise ValueError(f"not a deflate stream ({exc})") from None
    if longer:
        raise ValueError(f"not one whole deflate stream of {out.size} bytes (it holds more)")
    if not inflater.eof:
        raise ValueError("not one whole deflate stream (it is cut short)")
    if inflater.unused_data or tail or i < view.nbytes:
        raise ValueError("not one whole deflate stream (other bytes follow it)")
    if a != out.size:
        raise ValueError(f"a deflate stream of {a} bytes, expected {out.size}")
    return crc


def pwrite(fd: int, data: Any, offset: int) -> None:
    """Write all of ``data`` (bytes-like) at ``offset`` of file ``fd``."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class RawChunks:
    """Chunks written as they are, each at its place ``at`` in the file, summed on a thread
    beside the write.  :meth:`scratch` hands out one buffer, free again once :meth:`put` returns."""

    compression = None  # the manifest's "compression"

    def __init__(self, fd: int, writeback: Writeback, sums: ThreadPoolExecutor, nbytes: int) -> None:
        self._fd, self._writeback, self._sums = fd, writeback, sums
        self._scratch = np.empty(nbytes, dtype=np.uint8)
        self.end = 0  # the end of the furthest chunk written

    def scratch(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` to copy a chunk into before :meth:`put`."""
        return self._scratch[:nbytes]

    def put(self, piece: np.ndarray, at: int, chunks: list[list[int]]) -> None:
        """Write ``piece`` (uint8) at ``at`` of the file and append its record to ``chunks``."""
        summed = self._sums.submit(crc32, piece.data)  # beside the write: both only read the piece
        pwrite(self._fd, piece.data, at)
        self._writeback.wrote(at, piece.size)
        chunks.append([int(piece.size), summed.result(), at, int(piece.size)])
        self.end = max(self.end, at + piece.size)

    def finish(self) -> int:
        """The data's bytes in the file, every chunk written."""
        return self.end


class DeflatedChunks:
    """Chunks deflated on :data:`THREADS` threads and written one after the other, in the order
    put, from the start of the file; a chunk's record is complete once it is written (by a later
    :meth:`put`, :meth:`scratch` or :meth:`finish`).  A chunk put waits for nothing but a free
    thread: THREADS are deflated while the caller copies the next."""

    def __init__(self, fd: int, writeback: Writeback, pool: ThreadPoolExecutor, nbytes: int, using: str | None = None):
        self._fd, self._writeback, self._pool, self._using = fd, writeback, pool, _codec(using)[0]
        self._all = tuple(np.empty(nbytes, dtype=np.uint8) for _ in range(THREADS + 1))
        self._buffers = list(self._all)  # free
        self._queue: collections.deque[tuple[Future[tuple[int, bytes]], list[int], np.ndarray | None]] = (
            collections.deque()
        )
        self.end = 0
        self._synced = 0  # where the write-back not yet started begins: started a chunk's worth at a time
        self._span = nbytes

    @property
    def compression(self) -> dict[str, str]:
        """The manifest's ``compression``: the format and the implementation that deflated."""
        return {"format": "deflate", "by": self._using}

    def scratch(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes``, free until it is :meth:`put` (waits for the oldest chunk's
        deflate where every buffer is in flight)."""
        while not self._buffers:
            self._write_oldest()
        return self._buffers.pop()[:nbytes]

    def put(self, piece: np.ndarray, at: int, chunks: list[list[int]]) -> None:
        """Deflate ``piece`` (uint8; a :meth:`scratch` buffer, or bytes nobody changes until
        :meth:`finish`) and append its record to ``chunks``; ``at`` (a raw chunk's place) is
        not used: deflated chunks follow one another."""
        record = [int(piece.size), 0, 0, 0]
        chunks.append(record)
        owned = next((b for b in self._all if piece.base is b), None)  # free again once written
        self._queue.append((self._pool.submit(_summed_deflate, piece.data, self._using), record, owned))
        while len(self._queue) > THREADS:
            self._write_oldest()

    def finish(self) -> int:
        """Write every chunk still being deflated; the data's bytes in the file."""
        while self._queue:
            self._write_oldest()
        if self.end > self._synced:
            self._writeback.wrote(self._synced, self.end - self._synced)
        return self.end

    def _write_oldest(self) -> None:
        done, record, buffer = self._queue.popleft()
        crc, stream = done.result()
        pwrite(self._fd, stream, self.end)
        record[1:] = [crc, self.end, len(stream)]
        self.end += len(stream)
        if buffer is not None:
            self._buffers.append(buffer)
        if self.end - self._synced >= self._span:  # streams are small: write-back by the chunk's worth
            self._writeback.wrote(self._synced, self.end - self._synced)
            self._synced = self.end
