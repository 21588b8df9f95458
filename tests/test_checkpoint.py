"""Checkpoints: a table's whole state written in its own layout and restored -- rows, priorities,
orders, counters and the next draws -- for every legal table, taken while writers and a learner
run, atomic under SIGKILL, and refused by name when damaged."""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    EACH_START_METHOD,
    TAGGED_STACK_FIELDS,
    run_in_child,
    segments_of,
    start_lock_holder,
    tagged_episode,
)

import mpreplay
from mpreplay import CheckpointError, MinSize, Queue, SequenceSpec, SharedMemoryError, Table, removers, selectors

pytestmark = pytest.mark.timeout(120, method="thread")

STORAGE = {"plain": {}, "compressed": {"next_of": "obs", "stack_compress": "obs"}}
LIMITERS = {"none": None, "min_size": MinSize(4)}
SIZE = 64
COUNTERS = ("stored", "inserts", "reserved", "samples", "stale_updates_dropped", "torn_rows_resampled")

GRID = [
    pytest.param(
        sel,
        rem,
        lim,
        shared,
        storage,
        compress,
        id=f"{sel}-{rem}-{lim}-{'shared' if shared else 'local'}-{storage}-{'deflated' if compress else 'raw'}",
    )
    for sel, rem, lim, shared, storage, compress in itertools.product(
        selectors.names(), removers.names(), LIMITERS, (False, True), STORAGE, (False, True)
    )
    if storage == "plain" or removers.entry(rem).frames
]
COMPRESS = pytest.mark.parametrize("compress", [False, True], ids=["raw", "deflated"])


def _used(table: Table, episodes: tuple[int, ...] = (20, 25)) -> Table:
    """``table`` given tagged episodes of stacked frames, sampled from, its priorities updated."""
    rng = np.random.default_rng(7)
    for e, n in enumerate(episodes):
        steps = tagged_episode(0, e, n, rng=rng)
        table.add(**{name: steps[name] for name in table.get_env_dict()}, timeout=0)
    batch = table.sample(6, timeout=0)
    if table.config.by_priority:
        table.update_priorities(batch["indexes"], np.linspace(0.5, 3.0, 6))
    return table


def assert_same_table(original: Table, restored: Table, draws: int = 3) -> None:
    """Same rows in the same order and slots, same priorities and counters, same next draws."""
    a, b = original.get_all_transitions(indexes=True), restored.get_all_transitions(indexes=True)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    if original.config.by_priority:
        for x, y in zip(
            original.inspection().priorities(a["indexes"]), restored.inspection().priorities(b["indexes"]), strict=True
        ):
            np.testing.assert_array_equal(x, y)
    sa, sb = original.stats(), restored.stats()
    assert {k: sa[k] for k in COUNTERS} == {k: sb[k] for k in COUNTERS}
    for _ in range(draws):
        if original.get_stored_size() == 0:
            break
        x, y = original.sample(5, timeout=0), restored.sample(5, timeout=0)
        for name in x:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)
    restored.verify()


@pytest.mark.parametrize(("selector", "remover", "limiter", "shared", "storage", "compress"), GRID)
def test_every_legal_table_round_trips_rows_priorities_counters_and_next_draws(
    tmp_path, selector, remover, limiter, shared, storage, compress
):
    fields = {k: v for k, v in TAGGED_STACK_FIELDS.items() if storage == "compressed" or k != "next_obs"}
    with _used(
        Table(
            SIZE,
            fields,
            selector=selector,
            remover=remover,
            rate_limiter=LIMITERS[limiter],
            shared=shared,
            seed=3,
            # A remover that never overwrites takes a table whose draws retire rows.
            max_times_sampled=None if removers.entry(remover).overwrites else 2,
            **STORAGE[storage],
        )
    ) as table:
        table.checkpoint(tmp_path / "ck", compress=compress)
        with mpreplay.restore(tmp_path / "ck", shared=shared) as restored:
            assert type(restored) is Table and restored.config == table.config
            assert_same_table(table, restored)


MORE = {
    "sequence": lambda shared: Table(
        SIZE,
        {"tag": {"shape": (3,), "dtype": np.int64}, "done": {}},
        sequence=SequenceSpec.build(4, 2, True, 0.9),
        selector="prioritized",
        shared=shared,
        seed=3,
    ),
    "nstep": lambda shared: Table(
        SIZE,
        {"tag": {"shape": (3,), "dtype": np.int64}, "rew": {}, "done": {}},
        nstep={"size": 3, "gamma": 0.9, "next": None},
        selector="prioritized",
        shared=shared,
        seed=3,
    ),
    "max_times_sampled": lambda shared: Table(
        SIZE, {"tag": {"shape": (3,), "dtype": np.int64}, "done": {}}, max_times_sampled=2, shared=shared, seed=3
    ),
    "queue": lambda shared: Table(
        SIZE, {"tag": {"shape": (3,), "dtype": np.int64}, "done": {}}, rate_limiter=Queue(SIZE), shared=shared, seed=3
    ),
    "lanes": lambda shared: Table(
        SIZE,
        TAGGED_STACK_FIELDS,
        next_of="obs",
        stack_compress="obs",
        lanes=2,
        selector="prioritized",
        shared=shared,
        seed=3,
    ),
}


@COMPRESS
@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
@pytest.mark.parametrize("kind", sorted(MORE))
def test_sequence_nstep_retiring_queue_and_laned_tables_round_trip(tmp_path, kind, shared, compress):
    with MORE[kind](shared) as table:
        rng = np.random.default_rng(1)
        for e, n in enumerate((12, 14)):
            steps = tagged_episode(0, e, n, rng=rng)
            row = {name: steps[name] for name in ("tag", "done", "obs", "next_obs") if name in table.config.specs}
            if "rew" in table.config.specs:
                row["rew"] = np.arange(n, dtype=np.float32)
            table.add(**row, timeout=0)
        table.sample(3, timeout=0)
        table.checkpoint(tmp_path / "ck", compress=compress)
        with mpreplay.restore(tmp_path / "ck", shared=shared) as restored:
            # n-step's fields come back normalised (dtypes and shapes spelt out): they fold the same.
            assert dataclasses.replace(restored.config, nstep=None) == dataclasses.replace(table.config, nstep=None)
            assert_same_table(table, restored)
            if kind == "lanes":
                return  # a restored table's writer claims a lane never written first: it goes on elsewhere
            for t in (table, restored):  # and both go on alike
                steps = tagged_episode(0, 2, 9, rng=np.random.default_rng(2))
                row = {name: steps[name] for name in ("tag", "done", "obs", "next_obs") if name in t.config.specs}
                t.add(**row, **({"rew": np.ones(9, np.float32)} if "rew" in t.config.specs else {}), timeout=0)
            assert_same_table(table, restored)


def test_a_local_table_restores_shared_and_a_shared_one_local(tmp_path):
    for shared in (False, True):
        with _used(Table(SIZE, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs", shared=shared, seed=2)) as t:
            t.checkpoint(tmp_path / "ck")
            with mpreplay.restore(tmp_path / "ck", shared=not shared) as restored:
                assert restored.config.shared is not shared and (restored.name is not None) is not shared
                assert_same_table(t, restored)


def test_the_restored_table_is_of_the_class_that_wrote_it(tmp_path):
    with mpreplay.MPPrioritizedReplayBuffer(SIZE, {"obs": {}}, seed=0) as buffer:
        buffer.add(obs=np.arange(10.0))
        buffer.checkpoint(tmp_path / "ck")
        with mpreplay.restore(tmp_path / "ck") as restored:
            assert type(restored) is mpreplay.MPPrioritizedReplayBuffer
            assert_same_table(buffer, restored)


def test_a_shared_restore_takes_the_name_given_and_refuses_one_in_use(tmp_path):
    with Table(SIZE, {"obs": {}}, shared=True) as table:
        table.add(obs=np.arange(5.0))
        table.checkpoint(tmp_path / "ck")
        name = f"mpreplay-{os.getpid()}-restored"
        with mpreplay.restore(tmp_path / "ck", name=name) as restored:
            assert restored.name == name and restored.get_stored_size() == 5
            with pytest.raises(SharedMemoryError, match=r"name: a shared-memory segment .* exists already"):
                mpreplay.restore(tmp_path / "ck", name=name)
        with pytest.raises(ValueError, match="name: only a shared table"):
            mpreplay.restore(tmp_path / "ck", name=name, shared=False)
        with pytest.raises(ValueError, match="persist: only a shared table"):
            mpreplay.restore(tmp_path / "ck", persist=True, shared=False)
        with pytest.raises(TypeError, match="shared: expected a bool"):
            mpreplay.restore(tmp_path / "ck", shared="yes")
        with pytest.raises(TypeError, match="name: expected a segment name"):
            mpreplay.restore(tmp_path / "ck", name=7)
        with pytest.raises(ValueError, match="name: expected a segment name starting with 'mpreplay-'"):
            mpreplay.restore(tmp_path / "ck", name="replay")


def test_a_table_restores_under_the_name_it_had_once_it_is_gone(tmp_path):
    table = Table(SIZE, {"obs": {}}, shared=True)
    table.add(obs=np.arange(5.0))
    table.checkpoint(tmp_path / "ck")
    name = table.name
    table.close()
    with mpreplay.restore(tmp_path / "ck", name=name) as restored:
        assert restored.name == name and restored.get_stored_size() == 5


def test_a_table_of_files_restores_into_files_of_its_prefix(tmp_path):
    prefix = str(tmp_path / "replay")
    with _used(Table(SIZE, TAGGED_STACK_FIELDS, mmap_prefix=prefix, seed=1)) as table:
        table.checkpoint(tmp_path / "ck")
        expected = table.get_all_transitions()
    for name in os.listdir(tmp_path):
        if name.startswith("replay"):
            os.remove(tmp_path / name)
    with mpreplay.restore(tmp_path / "ck", shared=False) as restored:
        assert restored.config.mmap_prefix == prefix and os.path.exists(f"{prefix}_obs.dat")
        for name, rows in expected.items():
            np.testing.assert_array_equal(restored.get_all_transitions()[name], rows)


def test_a_checkpoint_never_replaces_what_is_not_one(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "data.csv").write_text("mine too")
    with Table(SIZE, {"obs": {}}) as table:
        for path in (tmp_path / "notes.txt", tmp_path / "folder"):
            with pytest.raises(ValueError, match=r"path: .* exists and is not a checkpoint"):
                table.checkpoint(path)
        (tmp_path / "empty").mkdir()
        table.checkpoint(tmp_path / "empty")
    assert (tmp_path / "notes.txt").read_text() == "mine" and os.listdir(tmp_path / "folder") == ["data.csv"]
    assert sorted(os.listdir(tmp_path)) == ["empty", "folder", "notes.txt"]


def test_a_table_of_files_restores_only_as_a_local_table(tmp_path):
    with Table(SIZE, {"obs": {}}, mmap_prefix=str(tmp_path / "replay")) as table:
        table.checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match=r"shared: a table whose arrays were in files \(mmap_prefix\)"):
        mpreplay.restore(tmp_path / "ck")


@EACH_START_METHOD
def test_a_checkpoint_that_cannot_have_the_lock_in_time_raises_and_leaves_nothing(tmp_path, method):
    with Table(SIZE, {"obs": {}}, shared=True) as table:
        table.add(obs=np.arange(5.0))
        holder = start_lock_holder(mp.get_context(method), table)
        try:
            with pytest.raises(TimeoutError, match="timed out waiting for the buffer's lock"):
                table.checkpoint(tmp_path / "ck", timeout=0.2)
        finally:
            holder.kill()
            holder.join(30)
        assert os.listdir(tmp_path) == []
        table.checkpoint(tmp_path / "ck", timeout=10)  # the holder's death repaired, the lock taken
        assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_an_open_episode_ends_at_the_checkpoint_and_its_lane_takes_a_new_writer(tmp_path):
    with Table(SIZE, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs", shared=True, seed=0) as table:
        rng = np.random.default_rng(0)
        table.add(**tagged_episode(0, 0, 10, ended=False, rng=rng))
        table.checkpoint(tmp_path / "ck")
        with mpreplay.restore(tmp_path / "ck") as restored:
            # The last step waits for a next observation only the gone writer had: not sampleable.
            assert restored.get_stored_size() == table.get_stored_size() == 9
            restored.add(**tagged_episode(1, 0, 5, rng=rng), timeout=0)
            tags = restored.get_all_transitions()["tag"]
            assert restored.get_stored_size() == 14 and sorted(map(tuple, tags[:, :2])) == [(0, 0)] * 9 + [(1, 0)] * 5
            assert restored.verify()["waiting"] == 1


def test_rows_being_written_at_the_checkpoint_are_left_out_and_their_slots_are_free_again(tmp_path):
    with Table(8, {"obs": {}}, shared=True, seed=0) as table:
        table.add(obs=np.arange(8.0))
        reservation = table.inspection().reserve(3)  # a writer mid-copy: its slots' old rows retired
        table.checkpoint(tmp_path / "ck")
        with mpreplay.restore(tmp_path / "ck", shared=False) as restored:
            assert restored.get_stored_size() == 5 and restored.verify()["being_written"] == 0
            restored.add(obs=np.arange(10.0, 18.0), timeout=0)  # a lap of the ring: the free slots too
            assert restored.get_all_transitions()["obs"].tolist() == list(range(10, 18))
            restored.verify()
        reservation.publish(timeout=10)
        assert table.get_stored_size() == 8  # the checkpoint changed nothing of the table


def test_a_new_checkpoint_replaces_the_previous_one_and_inspect_describes_it(tmp_path):
    with Table(SIZE, {"obs": {}}) as table:
        table.add(obs=np.arange(5.0))
        table.checkpoint(tmp_path / "ck")
        table.add(obs=np.arange(3.0))
        doc = table.checkpoint(tmp_path / "ck")
        assert doc["stored"] == 8 and sorted(os.listdir(tmp_path)) == ["ck"]
        with mpreplay.restore(tmp_path / "ck", shared=False) as restored:
            assert restored.get_stored_size() == 8
    out = subprocess.run(
        [sys.executable, "-m", "mpreplay", "inspect", str(tmp_path / "ck")], capture_output=True, text=True, check=True
    ).stdout
    assert "mpreplay checkpoint, format version 2" in out and "stored at the cut: 8" in out and "field:obs" not in out
    (tmp_path / "ck" / "manifest.json").unlink()
    refused = subprocess.run(
        [sys.executable, "-m", "mpreplay", "inspect", str(tmp_path / "ck")], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1 and "no checkpoint manifest there" in refused.stderr


# Rows of 64 KiB: a table of 6.4 MB whose rows span many pages and more than one read of restoring.
BIG_ROWS = {"frame": {"shape": (256, 256), "dtype": np.uint8}, "step": {"dtype": np.int64}}


def _big_table(shared: bool) -> Table:
    table = Table(100, BIG_ROWS, shared=shared)
    frames = np.random.default_rng(3).integers(0, 256, (90, 256, 256), dtype=np.uint8)
    table.add(frame=frames, step=np.arange(90))
    return table


@COMPRESS
@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_table_of_rows_spanning_many_pages_restores_byte_for_byte(tmp_path, shared, compress):
    with _big_table(shared) as table:
        table.checkpoint(tmp_path / "ck", compress=compress)
        want = table.get_all_transitions()
    for restore_shared in (False, True):
        with mpreplay.restore(tmp_path / "ck", shared=restore_shared) as restored:
            got = restored.get_all_transitions()
            assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_prioritized_table_cut_in_many_holds_restores_its_priorities_and_next_draws(tmp_path):
    with Table(40000, {"obs": {}}, selector="prioritized", seed=5) as table:
        table.add(obs=np.arange(39000.0), priorities=np.random.default_rng(5).uniform(0.1, 9.0, 39000))
        doc = table.checkpoint(tmp_path / "ck")
        assert doc["cut_holds"] > 2
        with mpreplay.restore(tmp_path / "ck", shared=False) as restored:
            assert_same_table(table, restored, draws=10)


def _largest(checkpoint: Path) -> dict[str, Any]:
    """The manifest's entry of the checkpoint's largest array: its chunks' records are ``[bytes,
    CRC-32, where stored in data.bin, bytes stored]``."""
    arrays = json.loads((checkpoint / "manifest.json").read_text())["arrays"]
    return max(arrays, key=lambda e: sum(c[0] for c in e["chunks"]))


def _flip(checkpoint: Path, at: int) -> None:
    with open(checkpoint / "data.bin", "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))


def test_a_bit_flipped_deep_inside_a_large_array_is_refused(tmp_path):
    with _big_table(True) as table:
        table.checkpoint(tmp_path / "ck")
    rows = _largest(tmp_path / "ck")  # the rows, 6.4 MB
    _flip(tmp_path / "ck", rows["chunks"][0][2] + 5_000_003)
    _refused(tmp_path / "ck", rf"data.bin: array '{rows['name']}', chunk 0 .* is damaged")


# -- damaged checkpoints ---------------------------------------------------------------------------


@pytest.fixture(params=[False, True], ids=["raw", "deflated"])
def checkpoint(tmp_path, request) -> Path:
    with _used(Table(SIZE, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs")) as table:
        table.checkpoint(tmp_path / "ck", compress=request.param)
    return tmp_path / "ck"


def _refused(path: Path, match: str) -> None:
    before = segments_of(os.getpid())
    for shared in (True, False):
        with pytest.raises(CheckpointError, match=match):
            mpreplay.restore(path, shared=shared)
    assert segments_of(os.getpid()) == before  # the table being filled was unlinked


def test_a_truncated_checkpoint_is_refused_naming_its_data_file(checkpoint):
    data = checkpoint / "data.bin"
    data.write_bytes(data.read_bytes()[:-100])
    _refused(checkpoint, r"data.bin: \d+ bytes, the manifest says \d+ \(truncated\?\)")


def test_a_bit_flipped_checkpoint_is_refused_naming_the_array_and_chunk(checkpoint):
    frames = _largest(checkpoint)  # the manifest says where each chunk's bytes (raw or deflated) lie
    _, _, at, stored = frames["chunks"][0]
    _flip(checkpoint, at + stored // 3)
    _refused(checkpoint, rf"data.bin: array '{frames['name']}', chunk 0 .* is damaged")


def test_a_chunk_whose_recorded_stored_length_is_wrong_is_refused_naming_it(checkpoint):
    arrays = json.loads((checkpoint / "manifest.json").read_text())["arrays"]
    frames = max(arrays, key=lambda e: sum(c[0] for c in e["chunks"]))
    frames["chunks"][0][3] -= 1
    _edit_manifest(checkpoint, arrays=arrays)
    _refused(checkpoint, rf"data.bin: array '{frames['name']}', chunk 0 .* is damaged")


def test_an_edited_or_missing_manifest_is_refused(checkpoint, tmp_path):
    manifest = checkpoint / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"stored": ', '"stored": 1'))
    _refused(checkpoint, "the manifest is damaged")
    manifest.write_text(text[: len(text) // 2])
    _refused(checkpoint, "not a readable checkpoint manifest")
    _refused(tmp_path / "nowhere", "no checkpoint manifest there")


def _edit_manifest(checkpoint: Path, **changes: Any) -> None:
    """Change entries of the manifest and sign it again (its own CRC-32 of its canonical JSON), as
    another writer of the format would have written it."""
    manifest = checkpoint / "manifest.json"
    doc = {**json.loads(manifest.read_text()), **changes}
    del doc["checksum"]
    doc["checksum"] = zlib.crc32(json.dumps(doc, sort_keys=True).encode())
    manifest.write_text(json.dumps(doc))


def test_a_checkpoint_of_another_format_version_is_refused_naming_both_versions(checkpoint):
    _edit_manifest(checkpoint, version=99)
    _refused(
        checkpoint, r"checkpoint format version 99 \(written by mpreplay .*\); this mpreplay .* reads versions 1, 2"
    )


# Written by format version 1 (mpreplay 0.3.0's first checkpoints, each chunk raw at its array's
# offset) of the table ``_version_1_table`` makes.
VERSION_1 = Path(__file__).parent / "data" / "checkpoint-v1"


def _version_1_table() -> Table:
    return _used(Table(SIZE, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs", selector="prioritized", seed=3))


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_version_1_checkpoint_restores_the_table_it_was_taken_of(shared):
    with _version_1_table() as table, mpreplay.restore(VERSION_1, shared=shared) as restored:
        assert_same_table(table, restored)


def test_a_manifest_of_the_right_format_but_the_wrong_shape_is_refused_naming_the_entry(checkpoint):
    arrays = json.loads((checkpoint / "manifest.json").read_text())["arrays"]
    arrays[1]["chunks"] = "everything"
    _edit_manifest(checkpoint, arrays=arrays)
    _refused(checkpoint, r"the manifest's arrays\[1\] is not what a checkpoint writes there")


# -- other processes ------------------------------------------------------------------------------


def _checkpoint_once(table: Table, path: str) -> None:
    table.checkpoint(path)


@EACH_START_METHOD
def test_a_child_process_checkpoints_the_table_its_parent_checkpointed_too(tmp_path, method):
    with _used(Table(SIZE, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs", shared=True, seed=4)) as table:
        table.checkpoint(tmp_path / "parent")
        assert run_in_child(method, _checkpoint_once, table, str(tmp_path / "child"), timeout=60) == 0
        with mpreplay.restore(tmp_path / "child", shared=False) as restored:
            assert restored.get_stored_size() == table.get_stored_size()


# -- killed while checkpointing -------------------------------------------------------------------


def _checkpoint_for_ever(table: Table, path: str, compress: bool) -> None:
    while True:
        table.checkpoint(path, compress=compress)


@COMPRESS
@EACH_START_METHOD
def test_a_checkpoint_killed_midway_leaves_the_previous_one_whole_and_the_table_unharmed(tmp_path, method, compress):
    path = tmp_path / "ck"
    with Table(2048, {"obs": {"shape": (4096,), "dtype": np.uint8}, "id": {"dtype": np.int64}}, shared=True) as table:
        table.add(obs=np.ones((1000, 4096), np.uint8), id=np.arange(1000))
        table.checkpoint(path)
        table.add(obs=np.ones((500, 4096), np.uint8), id=np.arange(1000, 1500))
        child = mp.get_context(method).Process(target=_checkpoint_for_ever, args=(table, str(path), compress))
        child.start()
        try:
            tmp = Path(f"{path}.tmp-{child.pid}")
            deadline = time.monotonic() + 60
            while not (tmp / "data.bin").exists() and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.join(30)
        assert child.exitcode == -signal.SIGKILL
        with mpreplay.restore(path, shared=False) as restored:
            assert restored.get_stored_size() in (1000, 1500)  # the previous one, or a later whole one
            assert np.array_equal(restored.get_all_transitions()["id"], np.arange(restored.get_stored_size()))
        table.verify(timeout=10)
        table.add(obs=np.ones((1, 4096), np.uint8), id=[1500], timeout=10)
        assert table.get_stored_size() == 1501
        table.checkpoint(path)  # and the next checkpoint clears what the killed one left
        assert sorted(os.listdir(tmp_path)) == ["ck"]


# -- live: writers and a learner running ----------------------------------------------------------

LIVE_FIELDS = {"id": {"dtype": np.int64}, "obs": {"shape": (61,), "dtype": np.int64}, "check": {"dtype": np.int64}}


def _write_numbered(table: Table, writer: int, stop: Any) -> None:
    """Rows whose every field holds their number: writer * 10**9 + n, n counting up; 8 a
    millisecond at most, as actors stepping environments (a writer that laps the whole ring while
    a checkpoint copies it leaves nothing whole to keep)."""
    n = 0
    while not stop.is_set():
        ids = writer * 10**9 + np.arange(n, n + 8)
        table.add(id=ids, obs=np.repeat(ids[:, None], 61, axis=1), check=ids, timeout=10)
        n += 8
        time.sleep(0.001)


def _sample(table: Table, stop: Any) -> None:
    while not stop.is_set():
        table.sample(32, timeout=10)


def _checkpoints_while_running(
    method: str, table: Table, write: Any, full: int, folder: Path, learn: Any = _sample
) -> list[tuple[dict[str, Any], Path]]:
    """Three checkpoints of ``table`` into ``folder`` taken while two processes run ``write``
    (writers 1 and 2) and one ``learn`` (samples), once ``full`` rows are stored, the second deflated:
    ``(manifest, path)`` each."""
    ctx = mp.get_context(method)
    stop = ctx.Event()
    procs = [ctx.Process(target=write, args=(table, w, stop)) for w in (1, 2)]
    procs.append(ctx.Process(target=learn, args=(table, stop)))
    for p in procs:
        p.start()
    try:
        while table.get_stored_size() < full:
            time.sleep(0.01)
        taken = [(table.checkpoint(folder / f"ck{j}", compress=j == 1), folder / f"ck{j}") for j in range(3)]
    finally:
        stop.set()
        for p in procs:
            p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    return taken


@EACH_START_METHOD
@pytest.mark.parametrize("selector", ["uniform", "fifo"])
def test_a_checkpoint_taken_while_two_writers_and_a_learner_run_holds_whole_rows_in_order(tmp_path, method, selector):
    with Table(4096, LIVE_FIELDS, selector=selector, rate_limiter=MinSize(64), shared=True) as table:
        for doc, path in _checkpoints_while_running(method, table, _write_numbered, 4096, tmp_path):
            with mpreplay.restore(path, shared=False) as restored:
                rows = restored.get_all_transitions()
                ids = rows["id"]
                assert len(ids) == restored.get_stored_size() == doc["stored"] - doc["rows_left_out"] > 0
                np.testing.assert_array_equal(rows["check"], ids)  # no torn row
                np.testing.assert_array_equal(rows["obs"], np.repeat(ids[:, None], 61, axis=1))
                for w in (1, 2):  # each writer's rows in the order it wrote them
                    mine = ids[ids // 10**9 == w]
                    assert (np.diff(mine) > 0).all()
                restored.verify()


# Compressed: each frame names (writer, episode, step), so a row rebuilt from frames of another
# write shows.
FRAMED_FIELDS = {
    "tag": {"shape": (3,), "dtype": np.int64},
    "obs": {"shape": (3, 4), "dtype": np.uint8},
    "next_obs": {"shape": (3, 4), "dtype": np.uint8},
    "done": {},
}


def _frame(tags: np.ndarray) -> np.ndarray:
    """The frame of each step (rows of (writer, episode, step)): three bytes naming it."""
    return np.stack([tags[:, 0], tags[:, 1] % 251, tags[:, 2] % 241], axis=1).astype(np.uint8)


def _framed_episode(writer: int, episode: int, n: int) -> dict[str, np.ndarray]:
    """An episode of ``n`` steps whose stacks hold the frames of the last 4 steps (the first repeated)."""
    steps = np.arange(n + 1)
    tags = np.stack([np.full(n + 1, writer), np.full(n + 1, episode), steps], axis=1)
    frames = _frame(tags)
    stacks = np.moveaxis(frames[np.maximum(0, steps[:, None] - 3 + np.arange(4))], 1, -1)
    done = (steps[:n] == n - 1).astype(np.float32)
    return {"tag": tags[:n], "obs": stacks[:n], "next_obs": stacks[1:], "done": done}


def _added_priority(tags: np.ndarray) -> np.ndarray:
    """The priority a row of (writer, episode, step) is added with: 1 to 5, by its step."""
    return 1.0 + tags[..., 2] % 5


def _updated_priority(tags: np.ndarray) -> np.ndarray:
    """The priority a learner gives a row it drew: 10 to 16, by its episode and writer."""
    return 10.0 + (tags[..., 0] + tags[..., 1]) % 7


def _write_framed(table: Table, writer: int, stop: Any) -> None:
    lane_writer = table.episode_writer()
    by_priority = table.config.by_priority
    episode = 0
    while not stop.is_set():
        steps = _framed_episode(writer, episode, 40)
        for j in range(0, 40, 8):
            rows = {name: value[j : j + 8] for name, value in steps.items()}
            priorities = {"priorities": _added_priority(rows["tag"])} if by_priority else {}
            lane_writer.add(**rows, **priorities, timeout=10)
            time.sleep(0.001)
        episode += 1


def _sample_and_update(table: Table, stop: Any) -> None:
    while not stop.is_set():
        batch = table.sample(32, timeout=10)
        table.update_priorities(batch["indexes"], _updated_priority(batch["tag"]))


@EACH_START_METHOD
def test_a_live_checkpoint_of_a_compressed_table_rebuilds_every_row_from_its_own_frames(tmp_path, method):
    with Table(
        2048, FRAMED_FIELDS, next_of="obs", stack_compress="obs", lanes=2, rate_limiter=MinSize(64), shared=True
    ) as table:
        for doc, path in _checkpoints_while_running(method, table, _write_framed, 1900, tmp_path):
            with mpreplay.restore(path, shared=False) as restored:
                rows = restored.get_all_transitions()
                assert len(rows["tag"]) == doc["stored"] - doc["rows_left_out"] > 0
                for k in range(len(rows["tag"])):
                    writer, episode, step = rows["tag"][k]
                    expected = _framed_episode(writer, episode, 40)
                    np.testing.assert_array_equal(rows["obs"][k], expected["obs"][step])
                    np.testing.assert_array_equal(rows["next_obs"][k], expected["next_obs"][step])
                restored.verify()


def test_a_table_restored_persistent_outlives_its_restorer_and_attaches_by_name(tmp_path, table_name):
    with Table(SIZE, {"obs": {}}, shared=True) as table:
        table.add(obs=np.arange(5.0))
        table.checkpoint(tmp_path / "ck")
    restored = mpreplay.restore(tmp_path / "ck", name=f"mpreplay-{table_name}", persist=True)
    restored.close()  # nobody's: it stays
    again = mpreplay.attach(table_name, timeout=0)
    assert again.get_all_transitions()["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    again.close(unlink=True)


@EACH_START_METHOD
def test_a_live_checkpoint_cut_in_many_short_holds_keeps_whole_rows_with_a_priority_each_had(tmp_path, method):
    # 16384 slots of a prioritized compressed table: the cut copies them a block per hold of the
    # lock (several holds), lanes wrapping round across blocks.
    with Table(
        16384,
        FRAMED_FIELDS,
        next_of="obs",
        stack_compress="obs",
        lanes=2,
        selector="prioritized",
        rate_limiter=MinSize(64),
        shared=True,
    ) as table:
        taken = _checkpoints_while_running(method, table, _write_framed, 15000, tmp_path, _sample_and_update)
        for doc, path in taken:
            assert doc["cut_holds"] > 2
            with mpreplay.restore(path, shared=False) as restored:
                rows = restored.get_all_transitions(indexes=True)
                tags = rows["tag"]
                assert len(tags) == restored.get_stored_size() == doc["stored"] - doc["rows_left_out"] > 0
                for k in range(len(tags)):
                    expected = _framed_episode(tags[k, 0], tags[k, 1], 40)
                    np.testing.assert_array_equal(rows["obs"][k], expected["obs"][tags[k, 2]])
                    np.testing.assert_array_equal(rows["next_obs"][k], expected["next_obs"][tags[k, 2]])
                _, raw = restored.inspection().priorities(rows["indexes"])
                assert ((raw == _added_priority(tags)) | (raw == _updated_priority(tags))).all()
                restored.verify()
