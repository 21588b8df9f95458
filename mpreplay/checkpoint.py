"""Checkpoints: a table's whole state in its own layout, taken live, written atomically.

A checkpoint is a folder of two files: ``data.bin``, the bytes of the table's arrays as its
memory holds them (rows and frames as stored -- each frame once --, the slot states and
generations, the selector's state, the counters, the rate limiter's settings, the lanes), and
``manifest.json``: the format version, the mpreplay version, the table's configuration (as
JSON, :mod:`mpreplay.config_json`), every array's name, shape, dtype and chunks -- each with
the CRC-32 of its bytes and where they are stored in ``data.bin``, as they are or deflated
(``compress=True``, :mod:`mpreplay.checkpoint_codec`) --, and the random stream of the handle
that took it.  The manifest carries a CRC-32 of itself.  Nothing in it is code: restoring reads
JSON and raw or deflated bytes.

The cut is consistent without holding the lock across the copy.  Under the lock, in short
holds, the per-slot arrays and counters are copied to memory: that is the cut
(:mod:`mpreplay.checkpoint_cut`: a block of slots a hold where the selector's state is per
item, a priority tree's leaves; the counters, lanes and the rest in a last hold).  The rows and
frames -- the bulk -- are then copied a block of slots at a time without the lock while writers
go on; after each block, the slots' generations tell which of them changed since the cut copied
them (rewritten, or being written then).  Those rows, and the compressed rows that may read
their frames, are left out: retired in the cut's per-slot state (EMPTY, as a row drawn
``max_times_sampled`` times), which restoring takes out of the selector and the counters.  Every
other row is byte for byte what it was at the cut, with the priority it had at its block's
hold.  A write in flight at the cut is given up: its slots are free in the restored table.  A
lane's open episode ends at the cut: its complete rows stay, its last row waits for a next
observation that never comes (as when a writer dies), and the lane is free for the next writer.
See docs/architecture.md, "Checkpoints".

The folder is written as ``<path>.tmp-<pid>``, each file and the folder synced, then put in
place of ``<path>`` by one atomic exchange: a process killed at any point leaves the previous
checkpoint whole.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._ext.schema import (
    COMPLETE,
    EMPTY,
    GENERATION_ARRAY,
    HEADER_ARRAY,
    LANES_ARRAY,
    LOCK_ARRAY,
    MANIFEST_ARRAY,
    OWNER_ARRAY,
    ROWS_ARRAY,
    SEQUENCE_STEPS_ARRAY,
    STATE_ARRAY,
    STORED,
    field_array,
    frames_array,
)
from ._version import __version__
from .checkpoint_codec import THREADS, DeflatedChunks, RawChunks
from .checkpoint_cut import stepper, take
from .config_json import to_json
from .errors import CheckpointError
from .memory import Layout
from .table_config import TableConfig
from .writeback import Writeback, fsync_folder

__all__ = [
    "ALIGN",
    "CHUNK_BYTES",
    "DATA",
    "FORMAT",
    "READABLE",
    "VERSION",
    "Source",
    "describe",
    "flat_bytes",
    "read_manifest",
    "write",
]

FORMAT = "mpreplay-checkpoint"
VERSION = 2  # 2: a chunk records where its stored bytes lie, and may be deflated (checkpoint_codec.py)
READABLE = (1, 2)  # the format versions restore reads
MANIFEST = "manifest.json"
DATA = "data.bin"
CHUNK_BYTES = 16 * 2**20  # per checksum: small enough to copy while writers go on, large enough to stream
# The segment's own manifest and lock are the restored table's; no slot has a writer once restored.
NOT_STORED = (MANIFEST_ARRAY, LOCK_ARRAY, OWNER_ARRAY)
_BULK_PREFIXES = (field_array(""), frames_array(""))
ALIGN = 4096  # direct I/O's alignment of memory, file offset and length: a page, any disk's logical block


def _is_bulk(name: str) -> bool:
    """Whether array ``name`` holds rows or frames (copied without the lock) rather than per-slot
    state and counters (copied at the cut, under it)."""
    return name == ROWS_ARRAY or name.startswith(_BULK_PREFIXES)


def flat_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a 1-D uint8 view."""
    return array.reshape(-1).view(np.uint8)


def _with_readers(changed: np.ndarray, lanes: np.ndarray, back: int, ahead: int) -> np.ndarray:
    """``changed`` and every slot that may read a frame of a changed one: a compressed row reads
    slots at most ``back`` before and ``ahead`` after its own in its lane."""
    step = stepper(lanes, np.flatnonzero(changed))
    out = changed.copy()
    for k in range(-back, ahead + 1):
        out[step(-k)] = True  # the row k slots before a changed one reads it
    return out


def _closed_sequences(cut: dict[str, np.ndarray], lost: np.ndarray, length: int) -> np.ndarray:
    """The sequence starts (per slot, True) one of whose steps is ``lost``."""
    steps = cut[SEQUENCE_STEPS_ARRAY]
    starts = np.flatnonzero(steps > 0)
    step = stepper(cut[LANES_ARRAY], starts)
    broken = np.zeros(len(starts), dtype=bool)
    for k in range(length):
        broken |= (k < steps[starts]) & lost[step(k)]
    out = np.zeros(len(steps), dtype=bool)
    out[starts[broken]] = True
    return out


@dataclass(frozen=True)
class Source:
    """What a checkpoint reads of a table: its configuration, class name (``kind``), memory
    ``layout`` and ``arrays``, its lock (``hold`` by a deadline, ``let_go``), its TableHandle,
    and ``reach``: how many slots before and after its own a row's frames may lie in its lane."""

    config: TableConfig
    kind: str
    layout: Layout
    arrays: dict[str, np.ndarray]
    hold: Callable[[float], None]
    let_go: Callable[[], None]
    handle: Any
    reach: tuple[int, int]


def write(
    path: str | os.PathLike[str],
    source: Source,
    *,
    timeout: float | None,
    compress: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, Any]:
    """Write a checkpoint of the table ``source`` describes to folder ``path``, replacing the
    one there atomically; ``timeout`` bounds the wait for its lock; ``compress``: each chunk
    deflated (:mod:`mpreplay.checkpoint_codec`).  Returns the manifest written."""
    final = os.path.abspath(os.fspath(path))
    if os.path.lexists(final) and not (
        os.path.isdir(final) and (not os.listdir(final) or os.path.exists(os.path.join(final, MANIFEST)))
    ):
        raise ValueError(f"path: {final} exists and is not a checkpoint (nor an empty folder); it is left alone")
    tmp = f"{final}.tmp-{os.getpid()}"
    os.makedirs(os.path.dirname(final), exist_ok=True)
    _clear_leftovers(final)
    os.makedirs(tmp)
    try:
        doc = _write_folder(tmp, source, timeout, chunk_bytes, compress)
        fsync_folder(tmp)
        _put_in_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return doc


def _clear_leftovers(final: str) -> None:
    """Remove what checkpoints to ``final`` killed midway left: their ``.tmp-<pid>`` folders
    (and this process's own), and -- where no exchange was possible -- put a previous
    checkpoint moved aside to ``.old-<pid>`` back if none took its place."""
    folder, base = os.path.split(final)
    for entry in os.listdir(folder):
        stem, dot, pid = entry.rpartition("-")
        if not dot or not pid.isdigit() or stem not in (f"{base}.tmp", f"{base}.old"):
            continue
        if int(pid) != os.getpid() and _alive(int(pid)):
            continue
        where = os.path.join(folder, entry)
        if stem.endswith(".old") and not os.path.exists(final):
            os.rename(where, final)
        else:
            shutil.rmtree(where, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_folder(tmp: str, source: Source, timeout: float | None, chunk: int, compress: bool) -> dict[str, Any]:
    config, layout, arrays, handle = source.config, source.layout, source.arrays, source.handle
    stored = [e for e in layout.entries if e[0] not in NOT_STORED]
    back, ahead = source.reach
    if config.sequence is not None:  # a sequence reads its steps
        ahead = max(ahead, config.sequence.length - 1)
    taken = take(source, [name for name, *_ in stored if not _is_bulk(name)], timeout, (back, ahead))
    cut = taken.arrays
    state, gen, size = cut[STATE_ARRAY], cut[GENERATION_ARRAY], config.size
    stored_at_cut = int(np.count_nonzero(state == COMPLETE))
    bulk = [(name, shape, dtype, flat_bytes(arrays[name])) for name, shape, dtype, _ in stored if _is_bulk(name)]
    entries: list[dict[str, Any]] = []
    starts, offset = [], 0  # where each array lies in a raw checkpoint's file
    for (name, shape, dtype, flat), at in zip(bulk, (e[3] for e in stored if _is_bulk(e[0])), strict=True):
        # In the file where it lies in the segment modulo ALIGN: restoring reads it by direct I/O.
        offset += (at - offset) % ALIGN
        entries.append({"name": name, "shape": list(shape), "dtype": dtype, "chunks": []})
        starts.append(offset)
        offset += flat.size
    changed = taken.moved.copy()
    per_slot = sum(flat.size for *_, flat in bulk) // size
    block = max(1, chunk // max(1, per_slot))
    # Threads of each call's own (a forked child has none of its parent's) sum each chunk while
    # it is written, or deflate chunks while the next is copied (both release the GIL).
    with (
        open(os.path.join(tmp, DATA), "wb", buffering=0) as f,
        ThreadPoolExecutor(THREADS if compress else 1) as pool,
    ):
        writeback = Writeback(f.fileno())  # the disk writes as the copy goes on; the cache keeps 64 MB of it
        out = (DeflatedChunks if compress else RawChunks)(f.fileno(), writeback, pool, max(chunk, per_slot))
        # The rows and frames of a block of slots, then whether those slots changed since the
        # cut: a slot that did not held its cut's row while it was copied (whatever came after).
        for a in range(0, size if bulk else 0, block):
            b = min(size, a + block)
            for entry, start, (*_, flat) in zip(entries, starts, bulk, strict=True):
                width = flat.size // size
                piece = out.scratch((b - a) * width)
                np.copyto(piece, flat[a * width : b * width])
                out.put(piece, start + a * width, entry["chunks"])
            changed[a:b] |= handle.changed_since(gen, a, b)
        # A changed slot's bytes are not the cut's, and the rows that may read its frames cannot
        # be rebuilt: all are retired (EMPTY, as a row drawn max_times_sampled times), and every
        # write in flight at the cut is given up (its slots get the even generation of a free
        # slot: a restored table has no writer).  Restoring takes them out of the selector.
        lost = _with_readers(changed, cut[LANES_ARRAY], *source.reach) & (state != EMPTY)
        left_out = int(np.count_nonzero(lost & (state == COMPLETE)))
        state[lost] = EMPTY
        gen += gen & 1
        # The blocks' slot states are of their holds: the count the last hold copied may be another.
        cut[HEADER_ARRAY][STORED] = np.count_nonzero(state == COMPLETE)
        closed = 0
        if config.sequence is not None:
            broken = _closed_sequences(cut, lost, config.sequence.length)
            cut[SEQUENCE_STEPS_ARRAY][broken] = 0
            closed = int(broken.sum())
        for name, shape, dtype, _ in stored:
            if not _is_bulk(name):
                flat = flat_bytes(cut[name])
                chunks: list[list[int]] = []
                for a in range(0, flat.size, chunk):
                    out.put(flat[a : a + chunk], offset + a, chunks)
                entries.append({"name": name, "shape": list(shape), "dtype": dtype, "chunks": chunks})
                offset += flat.size
        data_nbytes = out.finish()
        writeback.finish()
        os.fsync(f.fileno())
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "mpreplay": __version__,
        "created": time.time(),
        "class": source.kind,
        "config": to_json(config),
        "nbytes": layout.nbytes,
        "data_nbytes": data_nbytes,
        "compression": out.compression,  # None: raw
        "stored": stored_at_cut,
        "rows_left_out": left_out,  # complete rows (a row waiting for its next frame is not stored)
        "sequences_closed": closed,
        "repair": bool(lost.any() or closed),
        "rng": taken.rng,
        "cut_seconds": taken.longest,  # the longest hold of the lock
        "cut_holds": taken.holds,
        "arrays": entries,
    }
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
        f.write(_signed(doc))
        f.flush()
        os.fsync(f.fileno())
    return doc


def _signed(doc: dict[str, Any]) -> str:
    """``doc`` as JSON with a CRC-32 of its canonical form (``checksum``)."""
    body = json.dumps(doc, sort_keys=True)
    return json.dumps({**doc, "checksum": zlib.crc32(body.encode())}, sort_keys=True, indent=1)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap ``a`` and ``b`` in one step (Linux's renameat2); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: no exchange on this filesystem
        return False
    raise OSError(err, os.strerror(err), b)


def _put_in_place(tmp: str, final: str) -> None:
    """Make the written folder ``tmp`` the checkpoint at ``final``, dropping the previous one."""
    parent = os.path.dirname(final)
    if not os.path.exists(final):
        os.rename(tmp, final)
    elif _exchange(tmp, final):
        shutil.rmtree(tmp)  # now the previous checkpoint
    else:
        # Two renames: killed between them, the previous checkpoint is whole at <path>.old-<pid>.
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    fsync_folder(parent)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at folder ``path``, checked (its own checksum, format and
    version) and in this version's form (a version 1 manifest's chunks say where they lie, its
    ``compression`` is None); :class:`~mpreplay.errors.CheckpointError` naming what is wrong
    otherwise."""
    where = os.path.join(os.fspath(path), MANIFEST)
    try:
        with open(where, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no checkpoint manifest there") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{where}: not a readable checkpoint manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an mpreplay checkpoint (format {FORMAT!r} expected)")
    checksum = doc.pop("checksum", None)
    if checksum != zlib.crc32(json.dumps(doc, sort_keys=True).encode()):
        raise CheckpointError(f"{where}: the manifest is damaged (its checksum does not match)")
    if doc.get("version") not in READABLE:
        raise CheckpointError(
            f"{where}: checkpoint format version {doc.get('version')!r} (written by mpreplay "
            f"{doc.get('mpreplay')}); this mpreplay {__version__} reads versions {', '.join(map(str, READABLE))}"
        )
    wrong = _malformed(doc)
    if wrong:
        raise CheckpointError(f"{where}: the manifest's {wrong} is not what a checkpoint writes there")
    if doc["version"] == 1:  # raw, each array's chunks one after the other from its offset
        doc["compression"] = None
        for e in doc["arrays"]:
            at = e.pop("offset")
            for c in e["chunks"]:
                c += [at, c[0]]
                at += c[0]
    return doc


# What a manifest's "compression" may be: raw, or deflated by either implementation (either inflates).
_COMPRESSIONS = (None, {"format": "deflate", "by": "isal"}, {"format": "deflate", "by": "zlib"})


def _is_ints(value: Any, length: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def _malformed(doc: dict[str, Any]) -> str | None:
    """The first entry of a manifest (of a version read) that is not of the kind written, or None."""
    kinds = {
        "class": str,
        "config": dict,
        "rng": dict,
        "repair": bool,
        "data_nbytes": int,
        "nbytes": int,
        "stored": int,
        "arrays": list,
    }
    for key, kind in kinds.items():
        if not isinstance(doc.get(key), kind):
            return f"{key!r}"
    v1 = doc["version"] == 1
    if not v1 and doc.get("compression") not in _COMPRESSIONS:
        return "'compression'"
    for j, e in enumerate(doc["arrays"]):
        if not (
            isinstance(e, dict)
            and isinstance(e.get("name"), str)
            and isinstance(e.get("dtype"), str)
            and _is_ints(e.get("shape"))
            and (not v1 or _is_ints([e.get("offset")]))
            and isinstance(e.get("chunks"), list)
            and all(_is_ints(c, 2 if v1 else 4) for c in e["chunks"])
        ):
            return f"arrays[{j}]"
    return None


def describe(path: str | os.PathLike[str]) -> str:
    """What ``mpreplay inspect`` prints for a checkpoint folder: its manifest's figures (the
    data is not read)."""
    doc = read_manifest(path)
    config = doc["config"]
    fields = ", ".join(f"{s['name']} {tuple(s['shape'])} {s['dtype']}" for s in config["specs"])
    raw = sum(c[0] for e in doc["arrays"] for c in e["chunks"])
    packing = doc["compression"]
    lines = [
        f"mpreplay checkpoint, format version {doc['version']}, written by mpreplay {doc['mpreplay']}",
        f"created: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc['created']))}",
        (
            f"class: {doc['class']}, capacity {config['size']}, selector {config['selector']['name']}, "
            f"remover {config['remover']}"
        ),
        f"fields: {fields}",
        (
            f"stored at the cut: {doc['stored']}; rows left out (changed during the copy): {doc['rows_left_out']}; "
            f"sequences closed: {doc['sequences_closed']}"
        ),
        (
            f"data: {doc['data_nbytes'] / 2**20:.1f} MiB (the table's memory: {doc['nbytes'] / 2**20:.1f} MiB); "
            f"the cut held the lock {doc.get('cut_holds', 1)} times, longest {doc['cut_seconds'] * 1e3:.1f} ms"
        ),
        (
            "compression: none (the arrays' bytes as they are)"
            if packing is None
            else f"compression: {packing['format']} by {packing['by']}, {raw / 2**20:.1f} MiB stored in "
            f"{doc['data_nbytes'] / 2**20:.1f} MiB (ratio {raw / max(1, doc['data_nbytes']):.1f}x)"
        ),
        "arrays:" if packing is None else "arrays (MiB as in memory, then as stored):",
    ]
    for e in doc["arrays"]:
        nbytes = sum(c[0] for c in e["chunks"])
        line = f"  {e['name']:<24} {tuple(e['shape'])!s:<22} {e['dtype']:<5} {nbytes / 2**20:9.2f} MiB"
        if packing is not None:
            line += f" {sum(c[3] for c in e['chunks']) / 2**20:9.2f} MiB"
        lines.append(line)
    return "\n".join(lines)
