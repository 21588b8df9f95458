"""Specification of save_transitions / load_transitions and the file format (version 1)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable
from typing import Any

import damage  # tests/damage.py: files taken apart and put together
import numpy as np
import pytest
from helpers import (
    EACH_START_METHOD,
    NUMBERED_FIELDS,
    assert_numbered,
    numbered_buffer,
    numbered_transitions,
    run_in_child,
    saved_file,
    transition_fields,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpreplay
from mpreplay import (
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RowsDroppedWarning,
)
from mpreplay.cli import main as cli
from mpreplay.fileformat import TransitionFileError, inspect, read_metadata


def save_transitions(buffer: ReplayBuffer, file: Any, **kwargs: Any) -> None:
    buffer.save_transitions(file, **kwargs)


def load_transitions(buffer: ReplayBuffer, file: Any) -> int:
    return buffer.load_transitions(file)


ENV = NUMBERED_FIELDS
CLASSES = [ReplayBuffer, PrioritizedReplayBuffer, MPReplayBuffer, MPPrioritizedReplayBuffer]
PRIORITIZED = [PrioritizedReplayBuffer, MPPrioritizedReplayBuffer]


def _assert_holds(buffer: ReplayBuffer, numbers) -> None:
    """Assert that ``buffer`` stores exactly the transitions ``numbers``, oldest first."""
    assert_numbered(buffer.get_all_transitions(), numbers)


def _priorities(buffer: PrioritizedReplayBuffer) -> np.ndarray:
    """Raw priority of every stored transition, oldest first."""
    return buffer.inspection().priorities(buffer.get_all_transitions(indexes=True)["indexes"])[1]


def _saved(buffer: ReplayBuffer, **kwargs: Any) -> bytes:
    return saved_file(buffer, **kwargs).getvalue()


def _valid_file(**kwargs: Any) -> bytes:
    """A small file: transitions 3..7 of a prioritized buffer of capacity 5 (wrapped)."""
    buffer = numbered_buffer(PrioritizedReplayBuffer, 5, range(8))
    buffer.update_priorities(np.arange(5), np.array([0.5, 1.0, 2.0, 3.0, 4.0]))
    return _saved(buffer, priorities=True, **kwargs)


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False], ids=["deflated", "stored"])
def test_a_round_trip_restores_every_transition(compress, tmp_path):
    path = tmp_path / "t.npz"
    save_transitions(numbered_buffer(ReplayBuffer, 16, range(10)), path, compress=compress)
    target = ReplayBuffer(16, ENV)
    assert load_transitions(target, path) == 10
    _assert_holds(target, range(10))


@pytest.mark.parametrize("target_cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("source_cls", CLASSES, ids=lambda c: c.__name__)
def test_transitions_move_between_any_two_kinds_of_buffer(source_cls, target_cls):
    with numbered_buffer(source_cls, 8, range(5)) as source, target_cls(8, ENV) as target:
        load_transitions(target, io.BytesIO(_saved(source)))
        _assert_holds(target, range(5))


def test_a_wrapped_ring_is_saved_oldest_first():
    data = np.load(io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 5, range(8)))), allow_pickle=False)
    np.testing.assert_array_equal(data["act"], [3, 4, 5, 6, 7])


def test_a_wrapped_ring_loads_back_in_order():
    target = ReplayBuffer(5, ENV)
    load_transitions(target, io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 5, range(8)))))
    _assert_holds(target, range(3, 8))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_empty_buffer_saves_and_loads_nothing(cls, unchanged):
    data = _saved(ReplayBuffer(4, ENV))
    assert read_metadata(io.BytesIO(data))["count"] == 0
    with numbered_buffer(cls, 4, [42]) as target, unchanged(target):
        assert load_transitions(target, io.BytesIO(data)) == 0


def test_loading_appends_after_what_the_buffer_holds():
    target = numbered_buffer(ReplayBuffer, 16, [100, 101])
    load_transitions(target, io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 8, range(3)))))
    _assert_holds(target, [100, 101, 0, 1, 2])


def test_loading_more_than_the_capacity_keeps_the_newest():
    target = ReplayBuffer(3, ENV)
    with pytest.warns(RowsDroppedWarning, match="8 rows written at once into a table of 3 slots: .* the 5 oldest"):
        assert load_transitions(target, io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 8, range(8))))) == 8
    _assert_holds(target, [5, 6, 7])


def _save_in_child(buffer: ReplayBuffer, path: str) -> None:
    save_transitions(buffer, path, priorities=True)


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_child_process_saves_a_shared_buffer_the_parent_loads(method, tmp_path):
    path = str(tmp_path / "t.npz")
    with numbered_buffer(MPPrioritizedReplayBuffer, 8, range(6)) as buffer:
        buffer.update_priorities(np.arange(6), np.arange(1.0, 7.0))
        assert run_in_child(method, _save_in_child, buffer, path) == 0
    target = PrioritizedReplayBuffer(8, ENV)
    load_transitions(target, path)
    _assert_holds(target, range(6))
    np.testing.assert_array_equal(_priorities(target), np.arange(1.0, 7.0))


# -- priorities ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target_cls", PRIORITIZED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("source_cls", PRIORITIZED, ids=lambda c: c.__name__)
def test_saved_priorities_are_restored(source_cls, target_cls):
    with numbered_buffer(source_cls, 5, range(8)) as source, target_cls(5, ENV) as target:
        source.update_priorities(np.arange(5), np.array([0.5, 1.0, 2.0, 3.0, 0.0]))
        expected = _priorities(source)
        load_transitions(target, io.BytesIO(_saved(source, priorities=True)))
        np.testing.assert_array_equal(_priorities(target), expected)


def test_a_priority_of_zero_is_saved_as_zero_even_with_eps_zero():
    source = numbered_buffer(PrioritizedReplayBuffer, 4, range(2), eps=0.0)
    source.update_priorities(np.arange(2), np.array([0.0, 2.0]))
    data = np.load(io.BytesIO(_saved(source, priorities=True)), allow_pickle=False)
    np.testing.assert_array_equal(data["priorities"], [0.0, 2.0])


def test_a_uniform_target_ignores_saved_priorities():
    target = ReplayBuffer(8, ENV)
    assert load_transitions(target, io.BytesIO(_valid_file())) == 5
    _assert_holds(target, range(3, 8))


def test_a_prioritized_target_gives_unsaved_priorities_its_default():
    target = PrioritizedReplayBuffer(8, ENV)
    target.add(**numbered_transitions([100]), priorities=[5.0])
    load_transitions(target, io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 4, range(3)))))
    np.testing.assert_array_equal(_priorities(target), [5.0, 5.0, 5.0, 5.0])


def test_saving_priorities_of_a_uniform_buffer_is_refused():
    with pytest.raises(ValueError, match="priorities: selector 'uniform' keeps no priorities to save"):
        _saved(numbered_buffer(ReplayBuffer, 4, range(2)), priorities=True)


# -- metadata and layout ------------------------------------------------------------------------


def test_plain_numpy_reads_the_file_without_pickle():
    data = np.load(io.BytesIO(_valid_file()), allow_pickle=False)
    metadata = json.loads(data["metadata.json"].tobytes())
    assert set(data.files) == {"metadata.json", "obs", "act", "rew", "done", "priorities"}
    assert metadata["count"] == 5
    np.testing.assert_array_equal(data["obs"], numbered_transitions(range(3, 8))["obs"])


def test_the_metadata_records_version_specs_settings_and_count():
    source = numbered_buffer(PrioritizedReplayBuffer, 8, range(3))
    assert read_metadata(io.BytesIO(_saved(source, priorities=True))) == {
        "format_version": 3,
        "mpreplay_version": mpreplay.__version__,
        "fields": [
            {"name": "obs", "shape": [3], "dtype": np.dtype(np.float32).str},
            {"name": "act", "shape": [], "dtype": np.dtype(np.int64).str},
            {"name": "rew", "shape": [], "dtype": np.dtype(np.float32).str},
            {"name": "done", "shape": [], "dtype": np.dtype(np.uint8).str},
        ],
        "nstep": None,
        "compression": None,
        "safe": True,
        "count": 3,
        "priorities": True,
        "episodes": False,
        "order": False,
    }


@pytest.mark.parametrize("compress, method", [(True, zipfile.ZIP_DEFLATED), (False, zipfile.ZIP_STORED)])
def test_compress_chooses_between_deflated_and_stored_arrays(compress, method):
    with zipfile.ZipFile(io.BytesIO(_saved(numbered_buffer(ReplayBuffer, 4, range(3)), compress=compress))) as archive:
        assert {info.compress_type for info in archive.infolist()} == {method}


def test_fields_named_like_numpy_savez_arguments_round_trip():
    env = {"file": {}, "allow_pickle": {"dtype": np.int64}}
    source = ReplayBuffer(4, env)
    source.add(file=[1.5, 2.5], allow_pickle=[1, 2])
    target = ReplayBuffer(4, env)
    load_transitions(target, io.BytesIO(_saved(source)))
    np.testing.assert_array_equal(target.get_all_transitions()["allow_pickle"], [1, 2])


# -- n-step transitions ------------------------------------------------------------------------

NSTEP_ENV = transition_fields((2,))


def _played(setting: tuple[int, float] | None, cls: type = ReplayBuffer) -> ReplayBuffer:
    """A buffer folding ``(size, gamma)`` steps (None: none) that was given one 6-step episode."""
    buffer = cls(32, NSTEP_ENV, nstep=None if setting is None else {"size": setting[0], "gamma": setting[1]})
    for t in range(6):
        buffer.add(obs=[t, t], act=t, rew=t + 1.0, next_obs=[t + 1, t + 1], done=float(t == 5))
    buffer.on_episode_end()
    return buffer


def test_the_metadata_records_the_nstep_settings():
    assert read_metadata(io.BytesIO(_saved(_played((3, 0.9)))))["nstep"] == {"size": 3, "gamma": 0.9}


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def test_folded_transitions_load_as_they_are_into_a_buffer_folding_alike(cls):
    source = _played((3, 0.9), cls)
    target = cls(32, NSTEP_ENV, nstep={"size": 3, "gamma": 0.9})
    assert load_transitions(target, io.BytesIO(_saved(source))) == 6
    got, want = target.get_all_transitions(), source.get_all_transitions()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_folding_target_restores_saved_priorities():
    source = _played((3, 0.9), PrioritizedReplayBuffer)
    source.update_priorities(np.arange(6), np.arange(1.0, 7.0))
    target = PrioritizedReplayBuffer(32, NSTEP_ENV, nstep={"size": 3, "gamma": 0.9})
    load_transitions(target, io.BytesIO(_saved(source, priorities=True)))
    np.testing.assert_array_equal(_priorities(target), np.arange(1.0, 7.0))


NSTEP_MISMATCHES = {
    "folded file, one-step buffer": ((3, 0.9), None),
    "one-step file, folding buffer": (None, (3, 0.9)),
    "other size": ((3, 0.9), (2, 0.9)),
    "other gamma": ((3, 0.9), (3, 0.99)),
}


@pytest.mark.parametrize("saved, wanted", NSTEP_MISMATCHES.values(), ids=NSTEP_MISMATCHES.keys())
def test_an_nstep_mismatch_is_refused_and_the_buffer_untouched(saved, wanted, unchanged):
    data, target = _saved(_played(saved)), _played(wanted)
    with unchanged(target), pytest.raises(ValueError, match=r"nstep: the file holds .* fold rewards twice or not"):
        load_transitions(target, io.BytesIO(data))


# -- compressed buffers -------------------------------------------------------------------------


def _steps(buffer: ReplayBuffer, episodes: int) -> ReplayBuffer:
    """Give ``buffer`` ``episodes`` 4-step episodes, then 3 steps of one more that goes on."""
    for e in range(episodes + 1):
        for t in range(4 if e < episodes else 3):
            o = 10 * e + t
            buffer.add(obs=[o, o], act=t, rew=1.0, next_obs=[o + 1, o + 1], done=float(t == 3))
    return buffer


@pytest.mark.parametrize(
    "source_kw, target_kw",
    [({"next_of": "obs"}, {}), ({}, {"next_of": "obs"}), ({"next_of": "obs"}, {"next_of": "obs"})],
    ids=["compressed to plain", "plain to compressed", "compressed to compressed"],
)
def test_transitions_move_between_compressed_and_plain_buffers(source_kw, target_kw):
    source = _steps(ReplayBuffer(32, NSTEP_ENV, **source_kw), 10)
    # Larger: a compressed buffer also spends a slot on each episode's last next observation.
    target = ReplayBuffer(64, NSTEP_ENV, **target_kw)
    count = load_transitions(target, io.BytesIO(_saved(source)))
    got, want = target.get_all_transitions(), source.get_all_transitions()
    assert len(got["obs"]) == count
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# -- files and paths ----------------------------------------------------------------------------


def test_a_path_is_written_exactly_as_given(tmp_path):
    save_transitions(numbered_buffer(ReplayBuffer, 4, range(2)), tmp_path / "replay.bin")
    assert os.listdir(tmp_path) == ["replay.bin"]


def test_saving_over_an_existing_file_replaces_it(tmp_path):
    path = tmp_path / "t.npz"
    save_transitions(numbered_buffer(ReplayBuffer, 4, range(2)), path)
    save_transitions(numbered_buffer(ReplayBuffer, 4, range(3)), path)
    assert read_metadata(path)["count"] == 3


def test_a_failed_save_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    save_transitions(numbered_buffer(ReplayBuffer, 4, range(2)), path)
    before = path.read_bytes()

    def disk_full(f, array, **kwargs):
        f.write(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_transitions(numbered_buffer(ReplayBuffer, 4, range(3)), path)
    assert os.listdir(tmp_path) == ["t.npz"]
    assert path.read_bytes() == before


def test_the_file_reaches_the_disk_before_it_takes_its_name(tmp_path, monkeypatch):
    events: list[str] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda *a: (events.append("replace"), replace(*a))[1])
    save_transitions(numbered_buffer(ReplayBuffer, 4, range(2)), tmp_path / "t.npz")
    assert "replace" in events and events.index("fsync") < events.index("replace")


class _Stream(io.RawIOBase):
    """A readable stream that cannot seek, like a pipe."""

    def __init__(self, data: bytes):
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._data.readinto(b)


def test_a_stream_that_cannot_seek_loads():
    target = ReplayBuffer(8, ENV)
    assert load_transitions(target, _Stream(_saved(numbered_buffer(ReplayBuffer, 8, range(4))))) == 4
    _assert_holds(target, range(4))


def test_a_text_mode_file_is_refused(tmp_path):
    with open(tmp_path / "t.txt", "w") as f, pytest.raises(TypeError, match="text-mode"):
        save_transitions(numbered_buffer(ReplayBuffer, 4, range(2)), f)


@pytest.mark.parametrize(
    "call", [lambda b: save_transitions(b, 42), lambda b: load_transitions(b, 42)], ids=["save", "load"]
)
def test_a_file_that_is_neither_path_nor_file_object_is_refused(call):
    with pytest.raises(TypeError, match="file: expected a path or a binary file object, got int"):
        call(ReplayBuffer(4, ENV))


def test_a_flag_that_is_not_a_bool_is_refused():
    with pytest.raises(TypeError, match="compress: expected a bool"):
        _saved(ReplayBuffer(4, ENV), compress="yes")


def test_a_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_transitions(ReplayBuffer(4, ENV), tmp_path / "absent.npz")


def _as_version_1(members: dict[str, Any], meta: dict[str, Any]) -> None:
    """A file as format version 1 wrote it: no 'episodes' key."""
    meta["format_version"] = 1
    del meta["episodes"], meta["order"]


def _as_version_2(members: dict[str, Any], meta: dict[str, Any]) -> None:
    """A file as format version 2 wrote it: no 'order' key."""
    meta["format_version"] = 2
    del meta["order"]


@pytest.mark.parametrize("version", [_as_version_1, _as_version_2], ids=["version 1", "version 2"])
def test_a_file_of_an_earlier_format_version_still_loads(version):
    target = ReplayBuffer(8, ENV)
    assert load_transitions(target, io.BytesIO(_edit(version))) == 5
    _assert_holds(target, range(3, 8))


# -- invalid files: a clear ValueError, the buffer untouched ------------------------------------


def _edit(change: Callable[[dict[str, Any], dict[str, Any]], None]) -> bytes:
    """The valid file after ``change(members, metadata)``."""
    members = damage.file_members(io.BytesIO(_valid_file()))
    change(members, members["metadata.json"])
    return damage.file_archive(members).getvalue()


def _field(meta: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in meta["fields"] if f["name"] == name)


def _drop_field(m: dict[str, Any], meta: dict[str, Any]) -> None:
    del m["done"]
    meta["fields"].remove(_field(meta, "done"))


def _add_field(m: dict[str, Any], meta: dict[str, Any]) -> None:
    m["extra"] = np.zeros(5, np.float32)
    meta["fields"].append({"name": "extra", "shape": [], "dtype": "<f4"})


def _reshape_obs(m: dict[str, Any], meta: dict[str, Any]) -> None:
    m["obs"] = np.zeros((5, 4), np.float32)
    _field(meta, "obs")["shape"] = [4]


def _retype_act(m: dict[str, Any], meta: dict[str, Any]) -> None:
    m["act"] = m["act"].astype(np.int32)
    _field(meta, "act")["dtype"] = "<i4"


INVALID = {
    "format version 4": (lambda m, meta: meta.update(format_version=4), "unsupported format version 4"),
    "version 1 with a version 2 key": (
        lambda m, meta: meta.update(format_version=1),
        r"keys of format version 1: missing \[\], unknown \['episodes', 'order'\]",
    ),
    "version 2 with a version 3 key": (
        lambda m, meta: meta.update(format_version=2),
        r"keys of format version 2: missing \[\], unknown \['order'\]",
    ),
    "order unlisted": (lambda m, meta: meta.update(order=True), "lists 'insertion.order' but the archive has no"),
    "order not a permutation": (
        lambda m, meta: (meta.update(order=True), m.update({"insertion.order": np.array([0, 1, 1, 3, 4])})),
        r"'insertion.order': expected a permutation of 0 \.\. count - 1",
    ),
    "order not a bool": (lambda m, meta: meta.update(order=1), "'order': expected true or false"),
    "episodes unlisted": (lambda m, meta: meta.update(episodes=True), "lists 'episode.id' but the archive has no"),
    "no format version": (lambda m, meta: meta.pop("format_version"), "unsupported format version None"),
    "unknown metadata key": (lambda m, meta: meta.update(extra=1), r"unknown \['extra'\]"),
    "field missing": (_drop_field, r"differ from the buffer's .*missing \['done'\]"),
    "extra field": (_add_field, r"differ from the buffer's .*extra \['extra'\]"),
    "shape mismatch": (
        _reshape_obs,
        r"field 'obs': the file stores shape \(4,\) float32, the buffer expects shape \(3,\)",
    ),
    "dtype mismatch": (
        _retype_act,
        r"field 'act': the file stores shape \(\) int32, the buffer expects shape \(\) int64",
    ),
    "array disagrees with its metadata": (
        lambda m, meta: m.update(obs=m["obs"].astype(np.float64)),
        r"array 'obs' is shape \(5, 3\) float64; expected shape \(5, 3\) float32",
    ),
    "count larger than the arrays": (lambda m, meta: meta.update(count=6), r"array 'obs' is shape \(5, 3\)"),
    "count smaller than the arrays": (lambda m, meta: meta.update(count=4), r"array 'obs' is shape \(5, 3\)"),
    "negative count": (lambda m, meta: meta.update(count=-1), "'count': expected an integer >= 0"),
    "array missing": (lambda m, meta: m.pop("rew"), "the metadata lists 'rew' but the archive has no such array"),
    "unlisted array": (lambda m, meta: m.update(junk=np.zeros(5)), "unexpected array 'junk'"),
    "priorities missing": (lambda m, meta: m.pop("priorities"), "lists 'priorities' but the archive has no such"),
    "priorities unlisted": (lambda m, meta: meta.update(priorities=False), "unexpected array 'priorities'"),
    "negative priority": (lambda m, meta: m["priorities"].__setitem__(2, -1.0), "priorities must be finite and >= 0"),
    "nan priority": (lambda m, meta: m["priorities"].__setitem__(0, np.nan), "priorities must be finite and >= 0"),
    "infinite priority": (lambda m, meta: m["priorities"].__setitem__(4, np.inf), "priorities must be finite and >= 0"),
    "float32 priorities": (
        lambda m, meta: m.update(priorities=m["priorities"].astype(np.float32)),
        "array 'priorities' is shape",
    ),
    "compressed layout": (lambda m, meta: meta.update(compression={"next_of": "obs"}), "compression layout"),
    "malformed nstep": (lambda m, meta: meta.update(nstep={"size": 0, "gamma": 0.9}), "'nstep': expected null"),
    "malformed safe flag": (lambda m, meta: meta.update(safe="yes"), "'safe': expected true or false"),
    "malformed fields": (lambda m, meta: meta.update(fields="obs"), "'fields': expected a non-empty list"),
    "object dtype field": (
        lambda m, meta: _field(meta, "act").update(dtype="|O"),
        "'fields': .*bool, integer or float",
    ),
    "metadata not JSON": (lambda m, meta: m.update({"metadata.json": b"{not json"}), "not UTF-8 JSON"),
    "metadata not UTF-8": (lambda m, meta: m.update({"metadata.json": b"\xff\xfe"}), "not UTF-8 JSON"),
    "metadata not an object": (lambda m, meta: m.update({"metadata.json": [1, 2]}), "not a JSON object"),
    "metadata not bytes": (lambda m, meta: m.update({"metadata.json": np.zeros(3)}), "array 'metadata.json' is shape"),
    "fortran-order array": (lambda m, meta: m.update(obs=np.asfortranarray(m["obs"])), "Fortran order"),
}


@pytest.mark.parametrize("change, message", INVALID.values(), ids=INVALID.keys())
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def test_an_invalid_file_is_refused_and_the_buffer_untouched(cls, change, message, unchanged):
    target = numbered_buffer(cls, 8, [100, 101])
    with unchanged(target), pytest.raises(ValueError, match=message):
        load_transitions(target, io.BytesIO(_edit(change)))


def _npz_without_metadata() -> bytes:
    f = io.BytesIO()
    np.savez(f, obs=np.zeros((2, 3)))
    return f.getvalue()


NOT_TRANSITIONS = {
    "empty": (b"", "not a readable .npz archive"),
    "text": (b"hello, world\n" * 10, "not a readable .npz archive"),
    ".npy file": (damage.npy_bytes(np.arange(3)), "not a readable .npz archive"),
    "npz without metadata": (_npz_without_metadata(), "not an mpreplay transitions file"),
    "truncated": (_valid_file()[:-100], "not a readable .npz archive"),
}


@pytest.mark.parametrize("data, message", NOT_TRANSITIONS.values(), ids=NOT_TRANSITIONS.keys())
def test_a_file_that_is_not_a_transitions_file_is_refused(data, message, unchanged):
    target = numbered_buffer(ReplayBuffer, 8, [100])
    with unchanged(target), pytest.raises(TransitionFileError, match=message):
        load_transitions(target, io.BytesIO(data))


class _Spy:
    """Unpickling this runs code: it records that it did."""

    ran = False

    def __reduce__(self):
        return _Spy._record, ()

    @staticmethod
    def _record() -> None:
        _Spy.ran = True


def test_a_header_claiming_more_data_than_stored_is_refused_before_allocating():
    members = damage.file_members(io.BytesIO(_valid_file()))
    members["metadata.json"]["count"] = 10**12
    del members["obs"]
    f = damage.file_archive(members)
    with zipfile.ZipFile(f, "a") as archive:
        archive.writestr("obs.npy", damage.npy_header("<f4", (10**12, 3)) + bytes(60))
    # 12 TB would not fit: reading the data first would end in MemoryError.
    with pytest.raises(ValueError, match="array 'obs' holds 60 bytes of data, its header says 12000000000000"):
        load_transitions(ReplayBuffer(8, ENV), io.BytesIO(f.getvalue()))


@pytest.mark.parametrize(
    ("old", "new"),
    [(b"), }", b" , }"), (b"'fortran_order'", b"b'fortran_orde'")],
    ids=["unclosed bracket", "bytes key"],
)
def test_an_array_header_numpy_cannot_parse_is_refused(unchanged, old, new):
    # numpy's header parser raises TokenError and TypeError (no ValueError) on these.
    members = damage.zip_members(_valid_file())
    header_end = members["obs.npy"].index(b"\n")
    assert members["obs.npy"][:header_end].count(old) == 1
    members["obs.npy"] = members["obs.npy"][:header_end].replace(old, new) + members["obs.npy"][header_end:]
    damaged = damage.zip_archive(members, zipfile.ZIP_STORED)
    target = numbered_buffer(ReplayBuffer, 8, [100])
    with unchanged(target), pytest.raises(ValueError, match="array 'obs' is damaged or truncated"):
        load_transitions(target, io.BytesIO(damaged))


def test_a_pickled_array_is_refused_without_being_unpickled():
    data = _edit(lambda m, meta: m.update(obs=np.array([_Spy()] * 5, dtype=object)))
    with pytest.raises(ValueError, match="array 'obs' is shape"):
        load_transitions(ReplayBuffer(8, ENV), io.BytesIO(data))
    assert not _Spy.ran


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compress", [True, False], ids=["deflated", "stored"])
def test_every_truncation_of_a_file_is_refused(compress, unchanged):
    data, target = _valid_file(compress=compress), numbered_buffer(PrioritizedReplayBuffer, 8, [100])
    for length in range(len(data)):
        with unchanged(target), pytest.raises(ValueError):
            load_transitions(target, io.BytesIO(data[:length]))


VALID = {True: _valid_file(compress=True), False: _valid_file(compress=False)}
SAVED_PRIORITIES = np.load(io.BytesIO(VALID[True]), allow_pickle=False)["priorities"]


@pytest.mark.timeout(300)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    compress=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_flipped_bytes_raise_value_error_or_load_the_original_transitions(compress, flips, unchanged):
    damaged = bytearray(VALID[compress])
    for position, mask in flips:
        damaged[position % len(damaged)] ^= mask
    scratch = PrioritizedReplayBuffer(8, ENV)
    try:
        load_transitions(scratch, io.BytesIO(damaged))
    except ValueError:
        target = numbered_buffer(PrioritizedReplayBuffer, 8, [100])
        with unchanged(target), pytest.raises(ValueError):
            load_transitions(target, io.BytesIO(damaged))
        with pytest.raises(ValueError):
            inspect(io.BytesIO(damaged))
    else:
        # The flips spared everything that matters (a time stamp, say): the file loads whole.
        _assert_holds(scratch, range(3, 8))
        np.testing.assert_array_equal(_priorities(scratch), SAVED_PRIORITIES)
        assert isinstance(inspect(io.BytesIO(damaged)), str)


# -- inspect ------------------------------------------------------------------------------------


def test_inspect_summarises_metadata_and_every_array():
    lines = inspect(io.BytesIO(_valid_file())).splitlines()
    assert "count             5" in lines
    assert "priorities        true" in lines
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("obs", "act", "priorities"))}
    assert rows["obs"] == ["obs", "5", "(3,)", "float32", "3", "700"]
    assert rows["act"] == ["act", "5", "()", "int64", "3", "7"]
    assert rows["priorities"] == ["priorities", "5", "()", "float64", "0.5", "4"]


def test_the_inspect_command_prints_the_summary(tmp_path, capsys):
    path = tmp_path / "t.npz"
    path.write_bytes(_valid_file())
    assert cli(["inspect", str(path)]) == 0
    assert capsys.readouterr().out == inspect(path) + "\n"


def test_the_inspect_command_reports_a_bad_file_and_fails(tmp_path, capsys):
    path = tmp_path / "t.npz"
    path.write_bytes(b"not an archive")
    with pytest.raises(SystemExit) as exit_:
        cli(["inspect", str(path)])
    assert exit_.value.code == 1
    assert "not a readable .npz archive" in capsys.readouterr().err
