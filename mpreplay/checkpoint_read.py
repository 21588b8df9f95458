"""Reading a checkpoint's ``data.bin`` into a new table's arrays, every chunk checked.

The bytes go from the disk straight into the arrays: where an array's place in the file and in
memory agree modulo :data:`ALIGN` (a checkpoint places its rows and frames so, see
:func:`mpreplay.checkpoint.write`), its aligned middle is read with direct I/O (``O_DIRECT``:
no copy through the page cache, whose pages a restore would only fill and drop), the rest
through the page cache.  :data:`READERS` reads of :data:`PART` bytes are in flight at once, so
the disk is never idle between two of them, while this thread sums each chunk as soon as its
reads are done.  Every chunk's CRC-32 is checked before the table is handed out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .checkpoint import ALIGN, DATA, crc32, flat_bytes
from .errors import CheckpointError

__all__ = ["PART", "READERS", "read_arrays"]

PART = 4 * 2**20  # bytes of one read
READERS = 4  # reads in flight


def read_arrays(path: str | os.PathLike[str], doc: dict[str, Any], into: dict[str, np.ndarray]) -> None:
    """Read the arrays ``doc`` lists from the checkpoint at ``path`` into ``into`` (by name,
    arrays of the recorded shape and dtype), checking every chunk; CheckpointError naming the
    array and chunk at the first that is short or does not match its checksum."""
    where = os.path.join(os.fspath(path), DATA)
    try:
        f = open(where, "rb", buffering=0)  # noqa: SIM115 -- closed by the with below; only opening is refused by name
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be read ({exc})") from None
    with f, _direct(where) as direct, ThreadPoolExecutor(READERS) as pool:
        size = os.fstat(f.fileno()).st_size
        if size != doc["data_nbytes"]:
            raise CheckpointError(f"{where}: {size} bytes, the manifest says {doc['data_nbytes']} (truncated?)")
        chunks: list[tuple[str, int, int, int, np.ndarray, list[Future[bool]]]] = []
        try:
            for entry in doc["arrays"]:
                flat = flat_bytes(into[entry["name"]])
                a = 0
                for j, (n, crc) in enumerate(entry["chunks"]):
                    piece = flat[a : a + n]
                    if piece.size != n:
                        raise _damaged(where, entry["name"], j, a, n)
                    reads = [
                        pool.submit(_read, part, at, fd, f.fileno())
                        for part, at, fd in _parts(piece, entry["offset"] + a, f.fileno(), direct)
                    ]
                    chunks.append((entry["name"], j, a, crc, piece, reads))
                    a += n
                if a != flat.size:
                    raise CheckpointError(f"{where}: array {entry['name']!r} holds {a} bytes, expected {flat.size}")
            for name, j, a, crc, piece, reads in chunks:
                if not all(r.result() for r in reads) or crc32(piece.data) != crc:
                    raise _damaged(where, name, j, a, piece.size)
        except BaseException:
            for *_, reads in chunks:
                for r in reads:
                    r.cancel()
            raise


@contextlib.contextmanager
def _direct(where: str) -> Iterator[int | None]:
    """A descriptor of ``where`` for direct I/O, or None where the system or filesystem has none."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECT)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _parts(piece: np.ndarray, offset: int, buffered: int, direct: int | None) -> Iterator[tuple[np.ndarray, int, int]]:
    """``piece`` (bytes at ``offset`` of the file) as reads of at most PART bytes: ``(view, file
    offset, descriptor)``, the direct descriptor for the aligned middle where there is one."""
    address = piece.ctypes.data
    if direct is None or (address - offset) % ALIGN:
        spans = [(0, piece.size, buffered)]
    else:
        head = min(piece.size, -address % ALIGN)
        body = head + (piece.size - head) // ALIGN * ALIGN
        spans = [(0, head, buffered), (head, body, direct), (body, piece.size, buffered)]
    for lo, hi, fd in spans:
        for a in range(lo, hi, PART):
            b = min(hi, a + PART)
            yield piece[a:b], offset + a, fd


def _read(view: np.ndarray, offset: int, fd: int, buffered: int) -> bool:
    """Fill ``view`` from ``offset`` of the file; False if the file ends first.  A filesystem
    that refuses direct I/O only when read (EINVAL) is read through the page cache instead."""
    data = memoryview(view.data).cast("B")
    while data.nbytes:
        try:
            n = os.preadv(fd, [data], offset)
        except OSError as exc:
            if fd == buffered or exc.errno != 22:
                raise
            fd = buffered
            continue
        if n == 0:
            return False
        data, offset = data[n:], offset + n
    return True


def _damaged(where: str, name: str, j: int, a: int, n: int) -> CheckpointError:
    return CheckpointError(
        f"{where}: array {name!r}, chunk {j} (bytes {a}..{a + n}) is damaged (short, or its checksum does not match)"
    )
