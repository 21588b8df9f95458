"""The replay buffers of this machine, seen from outside: what ``mpreplay ls``, ``top`` and ``rm`` show.

Every buffer segment in ``/dev/shm`` starts with its manifest (:mod:`mpreplay.manifest`), so any
process can map it and read it.  Everything here maps segments read-only and never takes their
lock: the counters are read as they are (each an aligned 8-byte word, so none is half-written),
which is what lets ``top`` watch a buffer while its writers and learner run, freeze or die,
and never slow them down.  The figures of one reading may be a few operations apart.

Nothing a segment holds is trusted: a manifest this version cannot read (damaged, of another
format, describing arrays that are not there) makes the segment *unreadable*: it is listed with
the reason, and every other segment is listed as usual.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import manifest, selectors
from ._ext.lock import read_holder, read_recoveries
from ._ext.processes import describe_process, token_alive, token_pid
from ._ext.schema import (
    CLOSED,
    HEADER_ARRAY,
    INSERTS,
    LANE_OWNER,
    LANES_ARRAY,
    LIMIT_MAX_DIFF,
    LIMIT_MIN_SIZE,
    LIMIT_ON,
    LIMIT_SPI,
    LIMITS_ARRAY,
    LOCK_ARRAY,
    LOCK_HOLDS,
    LOCK_WAIT_NS,
    SAMPLES,
    STALE,
    STORED,
    TORN,
    WRITER_INSERTS,
    WRITER_TOKEN,
    WRITERS_ARRAY,
)
from .memory import SEGMENT_PREFIX, SHM_DIR

__all__ = [
    "SHM_DIR",
    "BufferView",
    "Reading",
    "Removal",
    "Segment",
    "attached_processes",
    "frame",
    "list_segments",
    "remove_segments",
    "summary",
]


@dataclass(frozen=True)
class Segment:
    """One ``mpreplay-*`` segment: a buffer's (``document`` is its manifest), another's (a
    ``ParameterStore``'s: no manifest, ``document`` None), or one whose manifest this version
    cannot read (``document`` None, ``problem`` says why)."""

    name: str
    nbytes: int  # space it takes in /dev/shm
    owner_pid: int | None  # the creator, from the manifest or (without one) the name
    owner_alive: bool
    document: dict[str, Any] | None = field(repr=False)
    problem: str | None = None

    @property
    def persistent(self) -> bool:
        """Whether the table outlives its creator (``persist=True``): nobody's, kept until removed."""
        return self.document is not None and self.document["persist"] is True

    @property
    def kind(self) -> str:
        """The selector's name (``"prioritized"``, ``"uniform"``, ``"fifo"``, ... with ``", sequences
        of N"``, ``", compressed"`` appended), ``"unreadable"`` or ``"other"``."""
        if self.problem is not None:
            return "unreadable"
        if self.document is None:
            return "other"
        kind = self.document["selector"]  # checked: a registered selector's name
        sequence = self.document.get("sequence")
        if isinstance(sequence, dict) and isinstance(sequence.get("length"), int):
            kind += f", sequences of {sequence['length']}"
        if self.document["remover"] != "fifo":  # checked: a registered remover's name
            kind += f", {self.document['remover']}"
        return kind + (", compressed" if self.document.get("next_of") or self.document.get("stack_compress") else "")


def list_segments(shm_dir: str = SHM_DIR) -> list[Segment]:
    """Every ``mpreplay-*`` segment in ``shm_dir``, oldest first, whatever bytes it holds."""
    found = []
    for name in os.listdir(shm_dir):
        if not name.startswith(SEGMENT_PREFIX):
            continue
        try:
            st, head = _head(os.path.join(shm_dir, name))
        except OSError:  # unlinked meanwhile, or not ours to read
            continue
        if head is None:  # a folder, a FIFO: no segment
            continue
        try:
            document, problem = manifest.decode(head, st.st_size), None
        except manifest.ManifestError as exc:
            document, problem = None, str(exc)
        segment = Segment(name, st.st_blocks * 512, _owner(name, document), _alive(name, document), document, problem)
        found.append((st.st_mtime, segment))
    return [segment for _, segment in sorted(found, key=lambda item: item[0])]


def _head(path: str) -> tuple[os.stat_result, bytes | None]:
    """The status of the file at ``path`` and, if it is a regular file (as segments are), the
    bytes of its manifest."""
    # Non-blocking: opening a FIFO someone named like a segment must not wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        return st, os.pread(fd, manifest.NBYTES, 0) if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(fd)


def _owner(name: str, document: dict[str, Any] | None) -> int | None:
    if document is not None:
        return token_pid(document["owner"])
    pid = name[len(SEGMENT_PREFIX) :].split("-", 1)[0]
    # A pid names a process only while it fits a token's pid (Linux's pids do).
    if not (pid.isascii() and pid.isdigit() and len(pid) < 19):
        return None
    return int(pid) if 0 < int(pid) == token_pid(int(pid)) else None


def _alive(name: str, document: dict[str, Any] | None) -> bool:
    if document is not None:
        return token_alive(document["owner"])  # pid and start time: a reused pid is not the owner
    pid = _owner(name, document)
    # A bare pid is a token without a start time: alive while some process has that pid (the safe answer).
    return pid is not None and token_alive(pid)


def attached_processes(name: str, shm_dir: str = SHM_DIR) -> set[int]:
    """The processes that map segment ``name`` now: every handle's, the creator's, and a
    monitor's while it reads (from ``/proc/<pid>/maps``; only this user's processes, unless
    root).  A handle that died maps nothing: no count to repair."""
    line_end = f"{shm_dir}/{name}\n".encode()
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", "rb") as f:
            if line_end in f.read():
                found.add(int(pid))
    return found


def summary(segment: Segment, shm_dir: str = SHM_DIR) -> dict[str, Any] | None:
    """``ls``'s figures of ``segment``: name, owner, size, kind, whether it is persistent,
    capacity and fill, the processes attached and the writers alive among them, creation time
    (None where the segment cannot tell) and, for an unreadable segment, the ``problem``; None
    when it was unlinked meanwhile."""
    attached = attached_processes(segment.name, shm_dir)
    row = {
        "name": segment.name,
        "owner_pid": segment.owner_pid,
        "owner_alive": segment.owner_alive,
        "persistent": segment.persistent if segment.document is not None else None,
        "attached": len(attached) if segment.document is not None else None,
        "bytes": segment.nbytes,
        "kind": segment.kind,
        "capacity": None,
        "stored": None,
        "writers_alive": None,
        "created": None,
        "problem": segment.problem,
    }
    if segment.document is None:
        return row
    try:
        with BufferView(segment.name, shm_dir) as view:
            reading = view.read()
    except OSError:  # unlinked meanwhile
        return None
    except ValueError as exc:  # changed since it was listed (truncated, rewritten): listed without figures
        row.update(kind="unreadable", problem=str(exc))
        return row
    row.update(
        capacity=view.capacity,
        stored=int(reading.header[STORED]),
        created=segment.document["created"],
        writers_alive=sum(token_alive(token) for token in reading.writers),
    )
    return row


def creator(document: dict[str, Any]) -> str:
    """The process that made the table of manifest ``document``, with its state or ``: gone``."""
    return describe_process(token_pid(document["owner"])) + ("" if token_alive(document["owner"]) else ": gone")


def lifetime(document: dict[str, Any]) -> str:
    """How long the table of manifest ``document`` lives, in words."""
    if document["persist"]:
        return "persistent: kept until mpreplay rm or close(unlink=True)"
    return "ends with its creator"


@dataclass(frozen=True)
class Reading:
    """The counters of a buffer at one instant (``time.monotonic()``)."""

    at: float
    header: np.ndarray
    writers: dict[int, int]  # writer token -> transitions it published


class BufferView:
    """A read-only mapping of the buffer segment ``name`` (never its lock, never a write).

    ``writable`` maps it for writing too: only for ``mpreplay verify``, which takes the lock
    (a mutex is taken by writing to it; see :func:`mpreplay.consistency.verify_segment`)."""

    def __init__(self, name: str, shm_dir: str = SHM_DIR, *, writable: bool = False):
        """Map segment ``name`` of ``shm_dir``; ValueError when it is no buffer's segment this
        version can read (the message says why), OSError when it cannot be opened."""
        path = os.path.join(shm_dir, name)
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                raise ValueError(f"{name}: not a replay buffer segment (no manifest)")
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        finally:
            os.close(fd)
        try:
            # Checked against the mapping itself: every array below lies inside it.
            document = manifest.decode(self._map[: manifest.NBYTES], len(self._map))
        except manifest.ManifestError as exc:
            self._map.close()
            raise ValueError(f"{name}: unreadable: {exc}") from None
        if document is None:
            self._map.close()
            raise ValueError(f"{name}: not a replay buffer segment (no manifest)")
        self.name = name
        self.document = document
        self.capacity: int = document["capacity"]
        self.arrays = {
            array: np.frombuffer(self._map, np.dtype(dtype), math.prod(shape), offset).reshape(shape)
            for array, shape, dtype, offset in document["arrays"]
        }

    def read(self) -> Reading:
        """The counters now."""
        writers = self.arrays[WRITERS_ARRAY]
        return Reading(
            time.monotonic(),
            self.arrays[HEADER_ARRAY].copy(),
            {int(t): int(n) for t, n in zip(writers[:, WRITER_TOKEN], writers[:, WRITER_INSERTS], strict=True) if t},
        )

    def limiter(self) -> dict[str, float | None] | None:
        """The rate limiter's settings, or None: ``samples_per_insert`` (None for a limiter that
        only waits for ``min_size``, whose sample/insert bounds are infinite) and ``min_size``."""
        limits = self.arrays[LIMITS_ARRAY]
        if not limits[LIMIT_ON]:
            return None
        ratio = float(limits[LIMIT_SPI]) if np.isfinite(limits[LIMIT_MAX_DIFF]) else None
        return {"samples_per_insert": ratio, "min_size": float(limits[LIMIT_MIN_SIZE])}

    def lock_holder(self) -> tuple[int, float] | None:
        """``(pid, seconds)`` of the process holding the lock now, or None."""
        return read_holder(self.arrays[LOCK_ARRAY]) if LOCK_ARRAY in self.arrays else None

    def lock_recoveries(self) -> int:
        """How many times a process died holding the lock and the next holder repaired the buffer."""
        return (read_recoveries(self.arrays[LOCK_ARRAY]) or 0) if LOCK_ARRAY in self.arrays else 0

    def lanes(self) -> dict[int, int]:
        """Writer token -> the lane it fills, for buffers whose writers have lanes (compressed)."""
        owners = self.arrays[LANES_ARRAY][:, LANE_OWNER]
        return {int(t): lane for lane, t in enumerate(owners) if t} if len(owners) > 1 else {}

    def priorities(self) -> np.ndarray | None:
        """The priorities of the transitions that may be drawn now (None: a selector that keeps
        none).  Priorities are finite (the buffers refuse others): any other value is not shown."""
        name = self.document["selector"]  # the manifest was checked to hold the array it names
        return selectors.priorities(name, self.arrays[selectors.entry(name).array_name], self.capacity)

    @property
    def closed(self) -> bool:
        """Whether the owner closed the buffer."""
        return bool(self.arrays[HEADER_ARRAY][CLOSED])

    def close(self) -> None:
        self.arrays = {}
        with contextlib.suppress(BufferError):  # a caller still holds an array over the mapping: it unmaps with them
            self._map.close()

    def __enter__(self) -> BufferView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frame(view: BufferView, before: Reading, after: Reading) -> list[tuple[str, str]]:
    """``top``'s rows for the interval between two readings of ``view``: (label, value)."""
    dt = max(after.at - before.at, 1e-9)
    h0, h1 = before.header, after.header

    def rate(index: int) -> float:
        return (int(h1[index]) - int(h0[index])) / dt

    inserts, samples = rate(INSERTS), rate(SAMPLES)
    doc = view.document
    rows = [
        ("buffer", f"{view.name}  {doc['class']}, capacity {view.capacity:,}"),
        ("owner", creator(doc) + ("; closed" if view.closed else "")),
        ("lifetime", lifetime(doc)),
        ("attached", _attached(view.name, after)),
        ("fill", f"{int(h1[STORED]):,} / {view.capacity:,} ({int(h1[STORED]) / view.capacity:.1%})"),
        ("inserts/s", f"{inserts:,.0f}"),
        ("samples/s", f"{samples:,.0f}"),
    ]
    limiter = view.limiter()
    ratio = f"{samples / inserts:.2f}" if inserts > 0 else "–"
    if limiter is None:
        target = "no rate limiter"
    elif limiter["samples_per_insert"] is None:
        target = f"no target; sampling waits for {limiter['min_size']:,.0f} stored"
    else:
        target = f"target {limiter['samples_per_insert']:g}, min size {limiter['min_size']:,.0f}"
    rows.append(("samples per insert", f"{ratio} ({target})"))
    holds = rate(LOCK_HOLDS)
    # Summed over the waiters: three processes each waiting half the time make 1.5 s per s.
    rows.append(("lock wait", f"{rate(LOCK_WAIT_NS) / 1e9:.2f} s per s (all waiters), {holds:,.0f} holds/s"))
    holder = view.lock_holder()
    rows.append(
        ("lock holder", "free" if holder is None else f"{_describe_pid(holder[0])} for {holder[1] * 1e3:,.1f} ms")
    )
    recoveries = view.lock_recoveries()
    if recoveries:  # a run where no holder died shows no row for it
        rows.append(("lock recoveries", f"{recoveries:,} (holders that died with the lock; the next repaired)"))
    rows.append(("stale updates/s", f"{rate(STALE):,.0f}"))
    rows.append(("torn rows/s", f"{rate(TORN):,.0f}"))
    lanes = view.lanes()
    for token, count in sorted(after.writers.items()):
        per_s = (count - before.writers.get(token, 0)) / dt  # a writer new since `before` counts from 0
        lane = f", lane {lanes[token]}" if token in lanes else ""
        state = "" if token_alive(token) else ", gone"
        rows.append(("writer", f"pid {token_pid(token)}{lane}: {per_s:,.0f} inserts/s ({count:,} in all{state})"))
    priorities = view.priorities()
    if priorities is not None and len(priorities):
        rows.append(
            (
                "priorities",
                (f"min {priorities.min():.3g}  median {np.median(priorities):.3g}  max {priorities.max():.3g}"),
            )
        )
        rows.append(("histogram", _histogram(priorities)))
    return rows


def _attached(name: str, reading: Reading) -> str:
    """``top``'s count of the processes attached to segment ``name`` (itself left out)."""
    pids = attached_processes(name) - {os.getpid()}
    writing = pids & {token_pid(t) for t in reading.writers if token_alive(t)}
    return f"{len(pids)} processes: {len(writing)} writing, {len(pids - writing)} reading only (or idle)"


def _describe_pid(pid: int) -> str:
    """``describe_process(pid)``, for a pid read from the segment (which may be any word)."""
    return describe_process(pid) if 0 < pid == token_pid(pid) else f"pid {pid} (not a process id)"


_BARS = " ▁▂▃▄▅▆▇█"


def _histogram(values: np.ndarray, bins: int = 16) -> str:
    """A one-line histogram of ``values`` over log-spaced bins (priorities span decades)."""
    positive = values[values > 0]
    zeros = len(values) - len(positive)
    if not len(positive):
        return f"all {zeros:,} zero"
    lo, hi = np.log10(positive.min()), np.log10(positive.max())
    counts, _ = np.histogram(np.log10(positive), bins=bins, range=(lo, hi if hi > lo else lo + 1))
    bars = "".join(_BARS[int(np.ceil(c / counts.max() * (len(_BARS) - 1)))] for c in counts)
    return f"{10**lo:.2g} |{bars}| {10**hi:.2g}" + (f"  (+{zeros:,} zero)" if zeros else "")


@dataclass(frozen=True)
class Removal:
    """What ``remove_segments`` did with one segment."""

    name: str
    nbytes: int
    removed: bool
    reason: str = ""


def remove_segments(
    names: list[str] | None, *, dead: bool = False, force: bool = False, shm_dir: str = SHM_DIR
) -> list[Removal]:
    """Unlink the segments ``names`` (or, with ``dead``, every one whose owner is gone and that
    is not persistent: a persistent table is kept for the processes that will attach to it).

    Every name is checked before any segment is removed: one that names no mpreplay segment, or
    (without ``force``) a segment that is not persistent and whose owner is alive, keeps them
    all.  ``force`` removes live owners' segments too: their owner loses the buffer's name
    (attached processes keep their mapping, new ones cannot attach).  The handles of a removed
    table raise :class:`~mpreplay.TableGone` from their next call on (within a second).
    """
    segments = {s.name: s for s in list_segments(shm_dir)}
    if dead:
        return [_unlink(s, shm_dir) for s in segments.values() if not (s.owner_alive or s.persistent)]
    refused = {}
    for name in names or []:
        if name not in segments:
            refused[name] = f"no mpreplay segment named {name!r} in {shm_dir}"
        elif segments[name].owner_alive and not (force or segments[name].persistent):
            owner = segments[name].owner_pid
            assert owner is not None  # an owner found alive was found by its pid
            refused[name] = f"its owner, {describe_process(owner)}, is alive (--force removes it anyway)"
    if refused:
        return [
            Removal(
                name,
                segments[name].nbytes if name in segments else 0,
                False,
                refused.get(name, "another name was refused, so nothing was removed"),
            )
            for name in names or []
        ]
    return [_unlink(segments[name], shm_dir) for name in names or []]


def _unlink(segment: Segment, shm_dir: str) -> Removal:
    try:
        os.unlink(os.path.join(shm_dir, segment.name))
    except FileNotFoundError:
        return Removal(segment.name, 0, False, "already gone")
    return Removal(segment.name, segment.nbytes, True)
