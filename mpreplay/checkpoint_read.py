"""Reading a checkpoint's ``data.bin`` into a new table's arrays, every chunk checked.

Raw chunks go from the disk straight into the arrays: where an array's place in the file and in
memory agree modulo :data:`ALIGN` (a checkpoint places its rows and frames so, see
:func:`mpreplay.checkpoint.write`), its aligned middle is read with direct I/O (``O_DIRECT``:
no copy through the page cache, whose pages a restore would only fill and drop), the rest
through the page cache.  :data:`READERS` reads of :data:`PART` bytes are in flight at once, so
the disk is never idle between two of them, while this thread sums each chunk as soon as its
reads are done.  Deflated chunks (:mod:`mpreplay.checkpoint_codec`) are each read, inflated,
summed and copied to their place in the arrays by one of THREADS threads.  Every chunk's CRC-32
is checked before the table is handed out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checkpoint import ALIGN, DATA, flat_bytes
from .checkpoint_codec import THREADS, crc32, inflate_into
from .errors import CheckpointError

__all__ = ["PART", "READERS", "read_arrays"]

PART = 4 * 2**20  # bytes of one read
READERS = 4  # reads in flight


def read_arrays(path: str | os.PathLike[str], doc: dict[str, Any], into: dict[str, np.ndarray]) -> None:
    """Read the arrays ``doc`` (a manifest, :func:`~mpreplay.checkpoint.read_manifest`) lists from
    the checkpoint at ``path`` into ``into`` (by name, arrays of the recorded shape and dtype),
    checking every chunk; CheckpointError naming the array and chunk at the first that is short,
    misplaced, not a deflate stream of its length (deflated) or does not match its checksum."""
    where = os.path.join(os.fspath(path), DATA)
    try:
        f = open(where, "rb", buffering=0)  # noqa: SIM115 -- closed by the with below; only opening is refused by name
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be read ({exc})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != doc["data_nbytes"]:
            raise CheckpointError(f"{where}: {size} bytes, the manifest says {doc['data_nbytes']} (truncated?)")
        chunks = _chunks(where, doc, into)
        if doc["compression"] is None:
            _read_raw(where, f.fileno(), chunks)
        else:
            _inflate(where, f.fileno(), chunks)


def _chunks(where: str, doc: dict[str, Any], into: dict[str, np.ndarray]) -> list[Chunk]:
    """Every chunk of the manifest ``doc`` with the piece of ``into`` it fills; refused where a
    chunk does not fit its array or its stored bytes lie outside the data or, deflated, do not
    follow one another from the start of the data to its end."""
    chunks = []
    for entry in doc["arrays"]:
        flat = flat_bytes(into[entry["name"]])
        a = 0
        for j, (n, crc, at, stored) in enumerate(entry["chunks"]):
            chunk = Chunk(entry["name"], j, a, flat[a : a + n], crc, at, stored)
            if chunk.piece.size != n or at + stored > doc["data_nbytes"]:
                raise chunk.damaged(where, "it does not fit its array, or its bytes lie beyond the data")
            if doc["compression"] is None and stored != n:
                raise chunk.damaged(where, f"{stored} bytes stored for {n} in a raw checkpoint")
            chunks.append(chunk)
            a += n
        if a != flat.size:
            raise CheckpointError(f"{where}: array {entry['name']!r} holds {a} bytes, expected {flat.size}")
    if doc["compression"] is not None:  # deflated chunks fill the data one after the other
        ordered = sorted(chunks, key=lambda c: c.at)
        if not ordered:
            raise CheckpointError(f"{where}: the manifest lists no chunk of its {doc['data_nbytes']} bytes")
        if ordered[0].at != 0:
            raise ordered[0].damaged(where, f"its stored bytes begin at {ordered[0].at}, not at the data's start")
        ends = [c.at for c in ordered[1:]] + [doc["data_nbytes"]]
        for chunk, end in zip(ordered, ends, strict=True):
            if chunk.at + chunk.stored != end:
                raise chunk.damaged(
                    where, f"its {chunk.stored} stored bytes at {chunk.at} do not end where the next begin ({end})"
                )
    return chunks


@dataclass(frozen=True)
class Chunk:
    """A chunk of array ``name``: its ``j``-th, bytes ``a``.. of the array (``piece``, its place in
    the table), their ``crc``, and its ``stored`` bytes ``at`` the data file."""

    name: str
    j: int
    a: int
    piece: np.ndarray
    crc: int
    at: int
    stored: int

    def damaged(self, where: str, why: str = "short, or its checksum does not match") -> CheckpointError:
        return CheckpointError(
            f"{where}: array {self.name!r}, chunk {self.j} (bytes {self.a}..{self.a + self.piece.size}) is "
            f"damaged ({why})"
        )


def _read_raw(where: str, fd: int, chunks: list[Chunk]) -> None:
    """Read raw chunks into their pieces, READERS reads in flight, summing each as its reads end."""
    with _direct(where) as direct, ThreadPoolExecutor(READERS) as pool:
        reads: list[list[Future[bool]]] = []
        try:
            for c in chunks:
                reads.append([pool.submit(_read, part, at, d, fd) for part, at, d in _parts(c.piece, c.at, fd, direct)])
            for c, done in zip(chunks, reads, strict=True):
                if not all(r.result() for r in done) or crc32(c.piece.data) != c.crc:
                    raise c.damaged(where)
        except BaseException:
            for done in reads:
                for r in done:
                    r.cancel()
            raise


def _inflate(where: str, fd: int, chunks: list[Chunk]) -> None:
    """Read, inflate, sum and place deflated chunks, THREADS at once."""
    with ThreadPoolExecutor(THREADS) as pool:
        jobs = [pool.submit(_inflate_one, c, fd) for c in chunks]
        try:
            for c, job in zip(chunks, jobs, strict=True):
                why = job.result()
                if why is not None:
                    raise c.damaged(where, why)
        except BaseException:
            for job in jobs:
                job.cancel()
            raise


def _inflate_one(chunk: Chunk, fd: int) -> str | None:
    """Fill ``chunk``'s piece from its deflated bytes; None, or why it cannot (the piece may then
    hold part of them: the table being filled is dropped)."""
    stored = bytearray(chunk.stored)
    if not _read(np.frombuffer(stored, dtype=np.uint8), chunk.at, fd, fd):
        return "the file ends first"
    try:
        crc = inflate_into(stored, chunk.piece)
    except ValueError as exc:
        return str(exc)
    return None if crc == chunk.crc else "its checksum does not match"


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
