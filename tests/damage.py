"""What the damage and file tests share: real segments of each kind of buffer and their bytes, their
manifests taken apart and put together (the layout of :mod:`mpreplay.manifest`), transitions files,
zip archives and ``.npy`` members taken apart and put together, and the seeded damage the fuzzers do
to JSON records, bytes and segments."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import struct
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from helpers import transition_fields

from mpreplay import (
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    SampleToInsertRatio,
    manifest,
)
from mpreplay.monitor import SHM_DIR

ENV = transition_fields((4,))
HEAD = struct.Struct("<8sQ")  # the manifest's magic and length

# -- real segments -----------------------------------------------------------------------------


def prioritized() -> MPPrioritizedReplayBuffer:
    """Capacity 64, a rate limiter, 40 rows with priorities 0.5 to 2."""
    buffer = MPPrioritizedReplayBuffer(64, ENV, rate_limiter=SampleToInsertRatio(4.0, 10, 1e8))
    buffer.add(
        obs=np.ones((40, 4)),
        act=np.arange(40),
        rew=np.ones(40),
        next_obs=np.ones((40, 4)),
        done=np.zeros(40),
        priorities=np.linspace(0.5, 2.0, 40),
    )
    return buffer


def uniform() -> MPReplayBuffer:
    buffer = MPReplayBuffer(64, ENV)
    buffer.add(obs=np.ones((10, 4)), act=np.arange(10), rew=np.ones(10), next_obs=np.ones((10, 4)), done=np.zeros(10))
    return buffer


def compressed() -> MPReplayBuffer:
    buffer = MPReplayBuffer(
        64,
        {"obs": {"shape": (3, 2), "dtype": np.uint8}, "next_obs": {"shape": (3, 2), "dtype": np.uint8}, "done": {}},
        next_of="obs",
        stack_compress="obs",
        lanes=2,
    )
    frames = np.arange(30, dtype=np.uint8).reshape(10, 3)
    # Step t stacks frames t - 1 and t (the first frame repeated at the start), newest last.
    obs = np.stack([np.stack([frames[max(t - 1, 0)], frames[t]], axis=-1) for t in range(6)])
    buffer.add(obs=obs[:5], next_obs=obs[1:], done=np.array([0, 0, 0, 0, 1]))
    return buffer


def sequences() -> MPPrioritizedSequenceReplayBuffer:
    buffer = MPPrioritizedSequenceReplayBuffer(64, {"obs": {"shape": (2,)}, "done": {}}, length=8, period=4)
    buffer.add(obs=np.ones((20, 2)), done=np.eye(1, 20, 19)[0])
    return buffer


REAL = {"prioritized": prioritized, "uniform": uniform, "compressed": compressed, "sequences": sequences}


def path(name: str) -> str:
    """Where segment ``name`` is."""
    return os.path.join(SHM_DIR, name)


@contextlib.contextmanager
def manifest_rewritten(name: str, change: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """Segment ``name`` with its manifest changed by ``change``, put back afterwards."""
    fd = os.open(path(name), os.O_RDWR)
    try:
        original = os.pread(fd, manifest.NBYTES, 0)
        os.pwrite(fd, changed(original, change), 0)
        try:
            yield
        finally:
            os.pwrite(fd, original, 0)
    finally:
        os.close(fd)


def segment_bytes(buffer: Any) -> bytes:
    with open(path(buffer.name), "rb") as f:
        return f.read()


# -- manifests ---------------------------------------------------------------------------------


def document(raw: bytes) -> Any:
    """The manifest's JSON as it stands in ``raw`` (a segment's bytes), unchecked."""
    length = HEAD.unpack_from(raw)[1]
    return json.loads(raw[HEAD.size : HEAD.size + length])


def with_text(raw: bytes, text: bytes) -> bytes:
    """``raw`` with the manifest ``text``."""
    head = HEAD.pack(manifest.MAGIC, len(text)) + text
    return head + bytes(manifest.NBYTES - len(head)) + raw[manifest.NBYTES :]


def changed(raw: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``raw`` with its manifest changed by ``change`` (which edits the JSON object in place)."""
    edited = document(raw)
    change(edited)
    return with_text(raw, json.dumps(edited, separators=(",", ":")).encode())


def entry(edited: dict[str, Any], name: str) -> list[Any]:
    """The ``[name, shape, dtype, offset]`` entry of array ``name``."""
    (found,) = [a for a in edited["arrays"] if a[0] == name]
    return found


def setting(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.__setitem__(key, value)


def _dtype_byte_flip(d: dict[str, Any]) -> None:
    entry(d, "header")[2] = ",i8"  # one byte off: numpy's dtype parser raises SyntaxError


def writers_one_dimensional(d: dict[str, Any]) -> None:
    found = entry(d, "writers")
    found[1] = [int(np.prod(found[1]))]


def _header_past_the_end(d: dict[str, Any]) -> None:
    entry(d, "header")[3] = d["nbytes"] + 64


def _object_dtype(d: dict[str, Any]) -> None:
    entry(d, "tree")[2] = "|O"


# Damage a reader used to crash on, or could.
DAMAGE = {
    "dtype-byte-flip": _dtype_byte_flip,
    "writers-one-dimensional": writers_one_dimensional,
    "owner-beyond-a-c-long": setting("owner", 2**70),
    "capacity-zero": setting("capacity", 0),
    "created-beyond-any-date": setting("created", 1e300),
    "header-past-the-end": _header_past_the_end,
    "object-dtype": _object_dtype,
    "another-format": setting("version", 1),
    "class-with-a-terminal-escape": setting("class", "\x1b[2J"),
}


# -- random damage -----------------------------------------------------------------------------

# Values a damaged record may hold where a reader expects another: out of every range a C long, an
# int64, numpy or datetime has, of the wrong type, or right for another entry (a manifest's, a file's).
NASTY = [
    -1,
    0,
    1,
    7,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    2**70,
    1.5,
    1e300,
    -1e300,
    float("nan"),
    float("inf"),
    "",
    "x",
    "<i8",
    ",i8",
    "|O",
    "|V8",
    "<f8",
    "<U4",
    "tree",
    "members",
    "metadata.json",
    "priorities",
    None,
    True,
    False,
    [],
    [0],
    [-1],
    [2**40],
    [2**62, 2**62],
    [1] * 40,
    [0, 2**62],
    [[1]],
    {},
    {"length": 0},
    {"size": 0, "gamma": 2.0},
    ["header", [16], "<i8", 16384],
    [["header", [16], "<i8", 0]],
    {"name": "obs", "shape": [3], "dtype": "<f4"},
]
WORDS = [-1, 0, 1, 2**63 - 1, -(2**63), 2**62]
FLOATS = [np.inf, -np.inf, np.nan, 1e308, -1.0, 5e-324]


def _paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, prefix + (key,))


def _at(node: Any, where: tuple) -> Any:
    for key in where:
        node = node[key]
    return node


def rewritten(record: Any, rng: random.Random) -> Any:
    """``record`` (JSON) with one value, anywhere in it, replaced, removed, or swapped for another of its values."""
    paths = list(_paths(record))
    where, other = rng.choice(paths), rng.choice(paths)
    value = rng.choice(NASTY) if rng.random() < 0.8 else _at(record, other)
    if not where:
        return value
    parent = _at(record, where[:-1])
    if rng.random() < 0.1:
        del parent[where[-1]]
    else:
        parent[where[-1]] = json.loads(json.dumps(value))
    return record


def flipped(data: bytearray, at: int, rng: random.Random) -> None:
    """Flip bits of ``data[at]``: any, or a low one, which keeps JSON ASCII (a digit becomes another)."""
    data[at] ^= rng.choice([rng.randint(1, 255), 1 << rng.randrange(7)])


def damaged_manifest(raw: bytes, rng: random.Random) -> bytes:
    """``raw`` with its manifest damaged: JSON values rewritten, bytes flipped, its length field wrong."""
    length = HEAD.unpack_from(raw)[1]
    how = rng.random()
    if how < 0.5:
        record = document(raw)
        for _ in range(rng.randint(1, 3)):
            record = rewritten(record, rng)
        return with_text(raw, json.dumps(record, separators=(",", ":")).encode()[: manifest.NBYTES - HEAD.size])
    data = bytearray(raw)
    if how < 0.9:
        for _ in range(rng.randint(1, 4)):
            flipped(data, rng.randrange(HEAD.size + length + 1), rng)
    else:
        data[8:16] = struct.pack("<Q", rng.choice([0, 1, length - 1, length + 1, manifest.NBYTES, 2**64 - 1]))
    return bytes(data)


def damaged_segment(raw: bytes, rng: random.Random) -> bytes:
    """``raw`` damaged anywhere: its manifest, its counters and arrays, or its length."""
    how = rng.random()
    if how < 0.1:
        return raw[: rng.choice([rng.randrange(manifest.NBYTES), rng.randrange(len(raw))])]
    data = bytearray(damaged_manifest(raw, rng) if how < 0.6 else raw)
    if how >= 0.45:
        for _ in range(rng.randint(1, 8)):
            # Mostly the counters, writers and lanes just after the manifest; anywhere else too.
            end = manifest.NBYTES + 2048 if rng.random() < 0.6 else len(data)
            at = rng.randrange(manifest.NBYTES, end - 8) // 8 * 8
            word = struct.pack("<q", rng.choice(WORDS)) if rng.random() < 0.5 else struct.pack("<d", rng.choice(FLOATS))
            data[at : at + 8] = word
    return bytes(data)


def file_members(file: Any) -> dict[str, Any]:
    """The arrays of a transitions file (a path or a file object), its metadata record decoded."""
    members = dict(np.load(file, allow_pickle=False))
    members["metadata.json"] = json.loads(members["metadata.json"].tobytes())
    return members


def file_archive(members: dict[str, Any]) -> io.BytesIO:
    """A transitions file of ``members`` (as :func:`file_members` returns them, edited or not): a dict
    or list stored as a JSON record would be, bytes as they are, anything else as an array (pickled
    where it holds objects: a file a reader must refuse)."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w") as archive:
        for name, value in members.items():
            record = json.dumps(value).encode() if isinstance(value, dict | list) else value
            array = np.frombuffer(record, dtype=np.uint8) if isinstance(record, bytes) else record
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=True)
    f.seek(0)
    return f


def as_version_1(members: dict[str, Any]) -> dict[str, Any]:
    """``members`` (as :func:`file_members` returns them) edited into a file as format version 1
    wrote it: no episodes, in the metadata or as arrays."""
    members = as_version_2(members)
    meta = members["metadata.json"]
    meta["format_version"] = 1
    del meta["episodes"], members["episode.id"], members["episode.lane"]
    return members


def as_version_2(members: dict[str, Any]) -> dict[str, Any]:
    """``members`` edited into a file as format version 2 wrote it: no order of insertion."""
    meta = members["metadata.json"]
    meta["format_version"] = 2
    if meta.pop("order"):
        del members["insertion.order"]
    return members


# -- archives and .npy members, byte by byte ------------------------------------------------------


def zip_members(data: bytes) -> dict[str, bytes]:
    """The raw bytes of each member of the zip archive ``data``, by name."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zip_archive(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip archive of ``members``, raw bytes by name."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", compression=compression) as archive:
        for name, raw in members.items():
            archive.writestr(name, raw)
    return f.getvalue()


def npy_bytes(value: Any) -> bytes:
    """``value`` as a ``.npy`` member holds it (no pickle)."""
    f = io.BytesIO()
    np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
    return f.getvalue()


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header of an array of ``descr`` and ``shape``, without its data."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
    return f.getvalue()
