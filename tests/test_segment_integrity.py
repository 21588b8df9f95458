"""Whatever bytes a segment holds, ``ls``, ``top`` and ``rm`` never crash: a segment whose manifest
cannot be read is listed as unreadable, with the reason, beside the others; a manifest is refused
unless every entry a reader relies on is there and sound.

Segments are damaged as copies in a private folder used as ``/dev/shm`` (never in /dev/shm itself,
where other programs' ``mpreplay ls`` would read them)."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import random
import re
from typing import Any

import damage  # tests/damage.py: real segments and the fuzzers' damage
import numpy as np
import pytest
from helpers import crash_at

import mpreplay
from mpreplay import manifest, monitor
from mpreplay.cli import main
from mpreplay.monitor import BufferView, frame, list_segments, remove_segments, summary

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(scope="module")
def segments() -> dict[str, bytes]:
    """The bytes of a segment of each kind of buffer, with some rows in it."""
    out = {}
    for kind, make in damage.REAL.items():
        with make() as buffer:
            out[kind] = damage.segment_bytes(buffer)
    return out


def _write(folder: Any, name: str, data: bytes) -> None:
    # Rewritten in place: truncating to zero first costs a disk's file system a millisecond.
    fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _look(folder: str) -> list[dict[str, Any]]:
    """What ``ls``, ``top --once`` and ``rm --dead`` do, over ``folder``: ls's rows."""
    rows = [row for row in (summary(s, folder) for s in list_segments(folder)) if row is not None]
    for segment in list_segments(folder):
        try:
            view = BufferView(segment.name, folder)
        except ValueError:  # the documented refusal of a segment that is not a readable buffer
            continue
        with view:
            frame(view, view.read(), view.read())
    remove_segments(None, dead=True, shm_dir=folder)
    return rows


# -- the manifest ------------------------------------------------------------------------------


def test_a_manifest_reads_back_what_was_written(segments):
    raw = segments["sequences"]
    document = damage.document(raw)
    description = {
        key: value for key, value in document.items() if key not in ("version", "mpreplay_version", "owner", "created")
    }
    out = np.zeros(manifest.NBYTES, np.uint8)
    manifest.encode(description, out, owner=document["owner"], created=1.5)
    assert manifest.decode(out.tobytes(), len(raw)) == {**document, "created": 1.5}
    assert (document["version"], document["mpreplay_version"]) == (manifest.VERSION, mpreplay.__version__)
    assert document["nbytes"] <= len(raw)


@pytest.mark.parametrize("head", [b"", b"mpreplax" + bytes(64), b"x" * 64], ids=["empty", "another-magic", "text"])
def test_bytes_without_the_magic_hold_no_manifest(head):
    assert manifest.decode(head) is None


@pytest.mark.parametrize(
    "head, problem",
    [
        (b"mpreplay", "the manifest is cut after 8 bytes"),
        (b"mpreplay" + (10**9).to_bytes(8, "little"), "its length field says 1000000000 bytes of JSON"),
        (damage.HEAD.pack(manifest.MAGIC, 3) + b"[1]", "the manifest is [1], not a JSON object"),
        (damage.HEAD.pack(manifest.MAGIC, 10) + b'{"a": NaN}', "NaN is not a number a manifest holds"),
    ],
    ids=["magic-only", "length-past-the-end", "not-an-object", "nan"],
)
def test_bytes_that_hold_a_broken_manifest_are_refused(head, problem):
    with pytest.raises(manifest.ManifestError, match=re.escape(problem)):
        manifest.decode(head)


def _offset_dropped(d: dict[str, Any]) -> None:
    damage.entry(d, "header").pop()


def _negative_shape(d: dict[str, Any]) -> None:
    damage.entry(d, "header")[1] = [-1]


@pytest.mark.parametrize(
    "change, problem",
    [
        (damage.setting("capacity", -1), "manifest entry 'capacity': expected an integer >= 1, got -1"),
        (damage.setting("owner", "me"), "manifest entry 'owner': expected a process token"),
        (lambda d: d.pop("sequence"), "manifest entry 'sequence' is missing"),
        (_offset_dropped, "an array entry is ['header', [16], '<i8']; expected [name, shape, dtype, offset]"),
        (_negative_shape, "array 'header': shape [-1] is not a list of at most 32 sizes"),
        (
            damage.writers_one_dimensional,
            "array 'writers' is int64 of shape (128,), readers index int64 of shape (64, 2)",
        ),
    ],
    ids=[
        "negative-capacity",
        "owner-not-a-token",
        "no-sequence",
        "array-without-offset",
        "negative-shape",
        "writers-one-dimensional",
    ],
)
def test_a_manifest_missing_what_readers_rely_on_is_refused_naming_it(change, problem, segments):
    raw = damage.changed(segments["prioritized"], change)
    with pytest.raises(manifest.ManifestError, match=re.escape(problem)):
        manifest.decode(raw[: manifest.NBYTES], len(raw))


# -- damaged segments: listed, marked unreadable, never a crash ----------------------------------


@pytest.mark.parametrize("broken", list(damage.DAMAGE))
def test_ls_lists_a_segment_whose_manifest_is_damaged_as_unreadable_beside_the_others(broken, segments, tmp_path):
    healthy, damaged = f"mpreplay-{os.getpid()}-aaaaaaaa", f"mpreplay-{os.getpid()}-bbbbbbbb"
    _write(tmp_path, healthy, segments["prioritized"])
    _write(tmp_path, damaged, damage.changed(segments["prioritized"], damage.DAMAGE[broken]))
    rows = {row["name"]: row for row in (summary(s, str(tmp_path)) for s in list_segments(str(tmp_path)))}
    assert (rows[healthy]["kind"], rows[healthy]["capacity"], rows[healthy]["stored"]) == ("prioritized", 64, 40)
    row = rows[damaged]
    assert (row["kind"], row["owner_pid"], row["capacity"]) == ("unreadable", os.getpid(), None)
    assert row["problem"] and row["bytes"] > 0


def test_the_ls_command_prints_an_unreadable_segment_and_why_and_exits_0(segments, tmp_path, monkeypatch, capsys):
    folder, name = str(tmp_path), f"mpreplay-{os.getpid()}-bbbbbbbb"
    _write(tmp_path, name, damage.changed(segments["uniform"], damage.DAMAGE["owner-beyond-a-c-long"]))
    monkeypatch.setattr(monitor, "list_segments", functools.partial(list_segments, folder))  # ls reads /dev/shm
    monkeypatch.setattr(monitor, "summary", functools.partial(summary, shm_dir=folder))
    assert main(["ls"]) == 0
    table, reason = capsys.readouterr().out.splitlines()[1:]
    assert re.fullmatch(rf"{name}\s+{os.getpid()} \(alive\)\s+–\s+[\d.]+ MiB\s+unreadable\s+–\s+–\s+–\s+–", table)
    assert reason == (
        f"{name}: unreadable: manifest entry 'owner': expected a process token (a pid and a start time), got {2**70}"
    )


@pytest.mark.parametrize("broken", list(damage.DAMAGE))
def test_top_refuses_a_segment_whose_manifest_is_damaged_and_says_why(broken, segments, tmp_path):
    name = f"mpreplay-{os.getpid()}-bbbbbbbb"
    _write(tmp_path, name, damage.changed(segments["prioritized"], damage.DAMAGE[broken]))
    with pytest.raises(ValueError, match=f"{name}: unreadable: "):
        BufferView(name, str(tmp_path))


def test_rm_dead_removes_an_unreadable_segment_whose_named_owner_is_gone(segments, tmp_path):
    gone = mp.get_context("fork").Process(target=int)
    gone.start()
    gone.join(30)
    dead, live = f"mpreplay-{gone.pid}-bbbbbbbb", f"mpreplay-{os.getpid()}-cccccccc"
    for name in (dead, live):
        _write(tmp_path, name, damage.changed(segments["uniform"], damage.DAMAGE["writers-one-dimensional"]))
    (removal,) = remove_segments(None, dead=True, shm_dir=str(tmp_path))
    assert (removal.name, removal.removed) == (dead, True)
    assert [s.name for s in list_segments(str(tmp_path))] == [live]


def test_top_shows_a_buffer_whose_counters_and_priorities_hold_any_value(segments, tmp_path):
    name = f"mpreplay-{os.getpid()}-aaaaaaaa"
    document = damage.document(segments["prioritized"])
    data = bytearray(segments["prioritized"])
    header, tree = (damage.entry(document, a)[3] for a in ("header", "tree"))
    data[header : header + 16 * 8] = np.full(16, -(2**63), np.int64).tobytes()
    raw = np.frombuffer(data, np.float64, count=(len(data) - tree) // 8, offset=tree).copy()
    raw[raw > 0] = np.inf  # every stored priority and sum infinite
    data[tree : tree + raw.nbytes] = raw.tobytes()
    _write(tmp_path, name, bytes(data))
    with BufferView(name, str(tmp_path)) as view:
        rows = dict(frame(view, view.read(), view.read()))
    assert rows["fill"].startswith("-9,223,372,036,854,775,808 / 64")
    assert "priorities" not in rows  # none is a priority a buffer stores


def test_top_says_a_lock_holder_word_that_is_no_pid_names_no_process(tmp_path):
    with damage.prioritized() as buffer:
        # SIGKILLed inside the critical section of the add.
        step = dict(obs=np.ones(4), act=0, rew=0.0, next_obs=np.ones(4), done=0.0)
        holder = mp.get_context("fork").Process(target=crash_at, args=("reserve", buffer.add), kwargs=step)
        holder.start()
        holder.join(60)
        raw = bytearray(damage.segment_bytes(buffer))  # the lock names the dead holder until the next taker recovers it
    _, (size,), _, offset = damage.entry(damage.document(bytes(raw)), "lock")
    words = np.frombuffer(raw, np.int64, size // 8, offset).copy()
    assert holder.pid in words
    words[words == holder.pid] = 2**40  # a word no pid can be
    raw[offset : offset + size] = words.tobytes()
    name = f"mpreplay-{os.getpid()}-aaaaaaaa"
    _write(tmp_path, name, bytes(raw))
    with BufferView(name, str(tmp_path)) as view:
        rows = dict(frame(view, view.read(), view.read()))
    assert rows["lock holder"].startswith(f"pid {2**40} (not a process id) for ")


def _state_named_tree(d: dict[str, Any]) -> None:
    damage.entry(d, "state")[0] = "tree"


def test_top_reads_priorities_only_from_the_tree_a_prioritized_manifest_names(segments, tmp_path):
    name = f"mpreplay-{os.getpid()}-aaaaaaaa"
    _write(tmp_path, name, damage.changed(segments["uniform"], _state_named_tree))
    with BufferView(name, str(tmp_path)) as view:
        assert view.priorities() is None
        assert "priorities" not in dict(frame(view, view.read(), view.read()))


@pytest.mark.parametrize("kind", list(damage.REAL))
def test_ls_top_and_rm_dead_never_crash_whatever_bytes_a_segment_holds(kind, segments, tmp_path):
    rng = random.Random(f"segments-{kind}")
    names = [f"mpreplay-{os.getpid()}-aaaaaaaa", f"mpreplay-{2**22 - 1}-bbbbbbbb"]  # a live and a gone owner
    for _ in range(500):
        name = rng.choice(names)
        _write(tmp_path, name, damage.damaged_segment(segments[kind], rng))
        rows = _look(str(tmp_path))
        assert all(row["kind"] != "unreadable" or row["problem"] for row in rows)
