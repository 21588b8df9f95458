"""Damaged files never crash a reader: whatever bytes a transitions file or a cpprb file holds,
``load_transitions`` and ``read_cpprb_transitions`` read it or refuse it with
:class:`~mpreplay.fileformat.TransitionFileError`, and a refused file changes no buffer.

Seeded loops damage real files thousands of times: bytes flipped anywhere (the zip's directory
and headers included), files cut, arrays damaged inside an archive rebuilt around them (so
that the zip's checksums hold), metadata values rewritten."""

from __future__ import annotations

import io
import json
import math
import random
import struct
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

import damage  # tests/damage.py: real segments and the fuzzers' damage
import numpy as np
import pytest
from helpers import NUMBERED_FIELDS, cpprb_buffer, numbered_buffer, numbered_transitions, saved_file

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer
from mpreplay.compat.cpprb_files import read_cpprb_transitions
from mpreplay.fileformat import TransitionFileError

ENV = NUMBERED_FIELDS
pytestmark = pytest.mark.timeout(120, method="thread")

# -- archives, taken apart and put together ------------------------------------------------------


def _damaged_bytes(raw: bytes, rng: random.Random) -> bytes:
    """``raw`` with bytes flipped, set, inserted or cut off."""
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        how = rng.random()
        if how < 0.1:
            del data[at:]
        elif how < 0.2:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        elif at < len(data):
            damage.flipped(data, at, rng)
    return bytes(data)


def _damaged_archive(data: bytes, rng: random.Random, record: str | None) -> tuple[str, bytes]:
    """``(how, damaged data)``: the archive ``data`` damaged one way or another.  ``record``
    names a member holding a JSON record in a uint8 array, whose values may be rewritten."""
    how = rng.choice(["bytes", "cut", "member", "member", "record"] if record else ["bytes", "cut", "member"])
    if how == "bytes":
        return how, _damaged_bytes(data, rng)
    if how == "cut":
        return how, data[: rng.randrange(len(data))]
    members = damage.zip_members(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        compression = archive.infolist()[0].compress_type
    if how == "record":
        text = np.load(io.BytesIO(members[record]), allow_pickle=False).tobytes()
        value = json.loads(text)
        for _ in range(rng.randint(1, 3)):
            value = damage.rewritten(value, rng)
        members[record] = damage.npy_bytes(np.frombuffer(json.dumps(value).encode(), np.uint8))
    else:
        name = rng.choice(list(members))
        members[name] = _damaged_bytes(members[name], rng)
    return how, damage.zip_archive(members, compression)


def _inflating_to(data: bytes, member: str, nbytes: int) -> bytes:
    """The archive ``data`` whose directory says that ``member`` inflates to ``nbytes`` bytes
    (its compressed bytes as they are: reading it ends early).  Zip's layout: APPNOTE 4.3.12, 4.3.16."""
    out = bytearray(data)
    at = struct.unpack_from("<I", out, out.rfind(b"PK\x05\x06") + 16)[0]  # the directory's first entry
    while out[at : at + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", out, at + 28)
        if out[at + 46 : at + 46 + name_length] == member.encode():
            struct.pack_into("<I", out, at + 24, nbytes)  # its uncompressed size
            return bytes(out)
        at += 46 + name_length + extra_length + comment_length
    raise AssertionError(f"no member {member}")


def _header_claiming(shape: tuple[int, ...], dtype: str) -> bytes:
    """A ``.npy`` header saying ``shape`` and ``dtype``, and 8 bytes of data."""
    return damage.npy_header(dtype, shape) + bytes(8)


def _peak_allocation(read: Callable[[], Any]) -> int:
    """Bytes allocated at the peak of ``read()`` (numpy reports its arrays to tracemalloc)."""
    tracemalloc.start()
    try:
        read()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# -- mpreplay's own files ----------------------------------------------------------------------


def _saved(compress: bool, priorities: bool) -> bytes:
    buffer = numbered_buffer(PrioritizedReplayBuffer, 8, range(11))
    buffer.update_priorities(np.arange(8), np.linspace(0.5, 4.0, 8))
    return saved_file(buffer, compress=compress, priorities=priorities).getvalue()


FILES = {"deflated-with-priorities": _saved(True, True), "stored": _saved(False, False)}


def _holds(buffer: ReplayBuffer, numbers: Any) -> bool:
    stored, expected = buffer.get_all_transitions(), numbered_transitions(list(numbers))
    return all(np.array_equal(stored[name], expected[name]) for name in ENV)


@pytest.mark.parametrize("file", list(FILES))
def test_load_transitions_refuses_any_damage_with_transition_file_error_and_changes_nothing(file, unchanged):
    rng = random.Random(f"transitions-{file}")
    target = numbered_buffer(PrioritizedReplayBuffer, 8, [100, 101])
    for _ in range(800):
        how, damaged = _damaged_archive(FILES[file], rng, "metadata.json.npy")
        scratch = PrioritizedReplayBuffer(8, ENV)
        try:
            scratch.load_transitions(io.BytesIO(damaged))
        except TransitionFileError:
            with unchanged(target), pytest.raises(TransitionFileError):
                target.load_transitions(io.BytesIO(damaged))
            continue
        if how in ("bytes", "cut"):
            # The zip's checksums guard every array: what loads is what was saved (a time stamp was hit).
            assert _holds(scratch, range(3, 11))


ROWS = 10**8  # what a damaged file claims: 2.5 GB of rows, in an archive of a few kilobytes


def test_a_header_holding_an_escape_python_warns_about_is_refused_without_a_warning():
    # numpy evaluates a header's text as a literal: "\\d" in it is an escape Python warns about.
    members = damage.zip_members(FILES["stored"])
    npy = members["rew.npy"]
    at = npy.index(b"'descr': '") + len(b"'descr': '")
    members["rew.npy"] = npy[:at] + b"\\d" + npy[at + 2 :]  # '<f4' -> '\d4', the header's length kept
    damaged = damage.zip_archive(members, zipfile.ZIP_STORED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TransitionFileError, match="rew"):
            PrioritizedReplayBuffer(8, ENV).load_transitions(io.BytesIO(damaged))
    assert [str(w.message) for w in caught] == []


def test_a_file_claiming_more_rows_than_it_holds_is_refused_before_they_are_allocated():
    members = damage.zip_members(FILES["stored"])
    record = json.loads(np.load(io.BytesIO(members["metadata.json.npy"]), allow_pickle=False).tobytes())
    record["count"] = ROWS
    members["metadata.json.npy"] = damage.npy_bytes(np.frombuffer(json.dumps(record).encode(), np.uint8))
    for field in record["fields"]:
        members[f"{field['name']}.npy"] = _header_claiming((ROWS, *field["shape"]), field["dtype"])
    damaged = damage.zip_archive(members, zipfile.ZIP_STORED)
    for field in record["fields"]:  # the directory agrees with the headers
        name = f"{field['name']}.npy"
        claimed = len(members[name]) - 8 + ROWS * np.dtype(field["dtype"]).itemsize * math.prod(field["shape"])
        damaged = _inflating_to(damaged, name, claimed)
    buffer = PrioritizedReplayBuffer(8, ENV)

    def load() -> None:
        with pytest.raises(TransitionFileError):
            buffer.load_transitions(io.BytesIO(damaged))

    assert _peak_allocation(load) < 2**24


# -- cpprb's files -----------------------------------------------------------------------------

CPPRB_FILES = {  # cpprb buffer options, save_transitions(safe=)
    "plain": ({}, True),
    "next_of+stack_compress-unsafe": ({"next_of": "obs", "stack_compress": "obs"}, False),
    "next_of+stack_compress-safe": ({"next_of": "obs", "stack_compress": "obs"}, True),
    "Nstep": ({"Nstep": {"size": 3, "gamma": 0.9, "rew": "rew"}}, True),
}


def _cpprb_file(options: dict[str, Any], safe: bool) -> bytes:
    buffer = cpprb_buffer(pytest.importorskip("cpprb"), options, [3, "end", 6])
    return saved_file(buffer, safe=safe).getvalue()


def test_a_cpprb_file_claiming_a_larger_array_than_it_holds_is_refused_before_it_is_allocated():
    members = damage.zip_members(_cpprb_file(*CPPRB_FILES["plain"]))
    members["version.npy"] = _header_claiming((ROWS,), "<i8")
    damaged = _inflating_to(
        damage.zip_archive(members, zipfile.ZIP_DEFLATED), "version.npy", len(members["version.npy"]) - 8 + 8 * ROWS
    )

    def read() -> None:
        with pytest.raises(TransitionFileError):
            read_cpprb_transitions(io.BytesIO(damaged))

    assert _peak_allocation(read) < 2**24


@pytest.mark.parametrize("file", list(CPPRB_FILES))
def test_the_cpprb_reader_refuses_any_damage_with_transition_file_error(file):
    original = _cpprb_file(*CPPRB_FILES[file])
    rng = random.Random(f"cpprb-{file}")
    read_cpprb_transitions(io.BytesIO(original))  # the undamaged file reads
    for _ in range(400):
        _, damaged = _damaged_archive(original, rng, None)
        try:
            got = read_cpprb_transitions(io.BytesIO(damaged))
        except TransitionFileError:
            continue
        assert all(
            isinstance(a, np.ndarray) and a.flags.writeable and len(a) == len(next(iter(got.values())))
            for a in got.values()
        )
