"""Shared-memory buffers: many writer processes, one learner, crashes and cleanup."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
from helpers import (
    EACH_START_METHOD,
    own_a_buffer,
    put_sampled_ids,
    rows_of,
    run_in_child,
    segment_exists,
    segments_of,
    start_buffer_owner,
    start_lock_holder,
    uniform_and_prioritized,
)

from mpreplay import BufferClosed, MPPrioritizedReplayBuffer, MPReplayBuffer, PrioritizedReplayBuffer
from mpreplay._ext.schema import LOCK_WAIT_NS
from mpreplay.memory import SharedMemoryError

BOTH = uniform_and_prioritized(MPReplayBuffer, MPPrioritizedReplayBuffer)

# Every field of a row encodes the same id, so a row mixed from two writes is visible.
ENV = {"obs": {"shape": (16,), "dtype": np.int64}, "id": {"dtype": np.int64}, "rew": {"dtype": np.float64}}


def _assert_consistent(batch: dict[str, np.ndarray]) -> None:
    ids = batch["id"]
    assert (batch["obs"] == ids[:, None]).all(), "a sampled row mixes two transitions"
    assert (batch["rew"] == ids).all(), "a sampled row mixes two transitions"


@pytest.fixture
def no_leak():
    """Fails the test if it leaves a shared-memory segment behind."""
    # Only this process's segments: other test runs may share the machine.
    before = segments_of(os.getpid())
    yield
    left = segments_of(os.getpid()) - before
    assert not left, f"segments left in /dev/shm: {sorted(left)}"


# -- child-process bodies (module level: spawn pickles them by name) ---------


def _write(buffer, rank: int, count: int, batch: int, done) -> None:
    start = rank * 10**9
    for first in range(start, start + count, batch):
        ids = np.arange(first, min(first + batch, start + count))
        if batch == 1:
            buffer.add(obs=np.full(16, ids[0], np.int64), id=int(ids[0]), rew=float(ids[0]))
        else:
            buffer.add(**rows_of(ENV, ids))
    done.set()


def _write_forever(buffer, rank: int) -> None:
    i = rank * 10**9
    while True:
        buffer.add(**rows_of(ENV, np.arange(i, i + 4)))
        i += 4


# -- pickling and attaching ---------------------------------------------------


@BOTH
def test_a_buffer_pickles_to_a_small_handle(cls, no_leak):
    with cls(100_000, ENV) as buffer:
        assert len(pickle.dumps(buffer)) < 2048


@BOTH
@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_child_sees_what_the_parent_wrote(cls, method, no_leak):
    ctx = mp.get_context(method)
    with cls(64, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.full(10, 7)))
        queue = ctx.Queue()
        child = ctx.Process(target=put_sampled_ids, args=(buffer, 8, queue))
        child.start()
        assert queue.get(timeout=30) == [7] * 8
        child.join(30)
        assert child.exitcode == 0


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_rows_written_by_a_child_are_sampled_by_the_parent(method, no_leak):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(1000, ENV) as buffer:
        done = ctx.Event()
        assert run_in_child(method, _write, buffer, 1, 100, 10, done) == 0
        assert buffer.get_stored_size() == 100
        assert sorted(buffer.get_all_transitions()["id"]) == list(range(10**9, 10**9 + 100))


def test_an_attached_handle_does_not_unlink_the_segment(no_leak):
    with MPReplayBuffer(16, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(3)))
        clone = pickle.loads(pickle.dumps(buffer))
        clone.close()
        assert segment_exists(buffer.name)
        assert buffer.get_all_transitions()["id"].tolist() == [0, 1, 2]
    assert not segment_exists(buffer.name)


def test_attaching_after_the_owner_closed_raises_a_clear_error(no_leak):
    buffer = MPReplayBuffer(16, ENV)
    handle = pickle.dumps(buffer)
    buffer.close()
    with pytest.raises(SharedMemoryError, match="no longer exists"):
        pickle.loads(handle)


def test_a_closed_buffer_raises_buffer_closed(no_leak):
    buffer = MPPrioritizedReplayBuffer(16, ENV)
    buffer.add(**rows_of(ENV, np.arange(3)))
    buffer.close()
    with pytest.raises(BufferClosed):
        buffer.add(**rows_of(ENV, np.arange(3)))
    with pytest.raises(BufferClosed):
        buffer.sample(2)


def test_close_is_idempotent(no_leak):
    buffer = MPReplayBuffer(16, ENV)
    buffer.close()
    buffer.close()


def test_too_little_free_shared_memory_raises_before_creating(monkeypatch, no_leak):
    import shutil

    from mpreplay import memory

    real = shutil.disk_usage
    monkeypatch.setattr(
        memory.shutil,
        "disk_usage",
        lambda path: real(path)._replace(free=64 * 2**20) if path == "/dev/shm" else real(path),
    )
    with pytest.raises(SharedMemoryError, match=r"/dev/shm has 64\.0 MiB free"):
        MPReplayBuffer(1_000_000, {"obs": {"shape": (84, 84), "dtype": np.uint8}})


# -- many writers, one learner --------------------------------------------------


@BOTH
@EACH_START_METHOD
@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [1, 7])
def test_writers_and_a_learner_never_see_a_torn_row_and_counts_add_up(cls, method, batch, no_leak):
    ctx = mp.get_context(method)
    writers, count = 3, 3000
    # A small ring makes writers lap the learner's copies: torn rows must be caught.
    with cls(64, ENV) as buffer:
        done = [ctx.Event() for _ in range(writers)]
        procs = [ctx.Process(target=_write, args=(buffer, r, count, batch, done[r])) for r in range(writers)]
        for p in procs:
            p.start()
        sampled = 0
        while not all(e.is_set() for e in done) or sampled == 0:
            if buffer.get_stored_size() == 0:
                continue
            out = buffer.sample(32)
            _assert_consistent(out)
            sampled += 32
            if cls is MPPrioritizedReplayBuffer:
                buffer.update_priorities(out["indexes"], (out["id"] % 5 + 1).astype(np.float64))
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        stats = buffer.stats()
        assert stats["inserts"] == writers * count
        assert stats["samples"] == sampled
        assert stats["stored"] == 64
        everything = buffer.get_all_transitions()
        _assert_consistent(everything)
        assert len(everything["id"]) == 64


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_a_writer_killed_mid_add_leaves_the_learner_sampling(method, no_leak):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(256, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(8)))
        for round_ in range(6):
            writer = ctx.Process(target=_write_forever, args=(buffer, round_ + 1))
            writer.start()
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                _assert_consistent(buffer.sample(16))
            os.kill(writer.pid, signal.SIGKILL)
            writer.join(10)
        # A fresh writer continues where the dead ones left off.
        done = ctx.Event()
        assert run_in_child(method, _write, buffer, 9, 512, 8, done) == 0
        batch = buffer.sample(256)
        _assert_consistent(batch)
        assert set(batch["id"] // 10**9) == {9}, "the survivor's rows replaced every slot"


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_process_killed_holding_the_lock_does_not_block_the_others(method, no_leak):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(10)))
        for _ in range(3):
            holder = start_lock_holder(ctx, buffer, wait=30, seconds=60)
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(10)
            _assert_consistent(buffer.sample(8))
            buffer.add(**rows_of(ENV, np.arange(10, 12)))
        assert buffer.stats()["lock_recoveries"] == 3


# -- priority updates ---------------------------------------------------------------


def test_an_update_for_a_slot_overwritten_by_another_process_is_dropped(no_leak):
    with MPPrioritizedReplayBuffer(4, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(4)))
        batch = buffer.sample(4)
        writer = pickle.loads(pickle.dumps(buffer))  # another handle, as in a writer process
        writer.add(**rows_of(ENV, np.arange(100, 104)))
        writer.close()
        before = buffer.inspection().arrays["tree"].copy()
        buffer.update_priorities(batch["indexes"], np.full(4, 50.0))
        assert buffer.stats()["stale_updates_dropped"] == 4
        assert (buffer.inspection().arrays["tree"] == before).all()
        assert buffer.get_max_priority() == 1.0


def test_an_update_in_a_forked_child_is_not_judged_by_the_parents_samples(no_leak):
    # The record of sampled generations is per process: a forked child starts without one.
    with MPPrioritizedReplayBuffer(8, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(8)))
        buffer.sample(8)
        assert run_in_child("fork", buffer.update_priorities, np.arange(8), np.full(8, 3.0)) == 0
        assert buffer.get_max_priority() == 3.0
        assert buffer.stats()["stale_updates_dropped"] == 0


# -- lifecycle -------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, numpy as np, sys
    from mpreplay import MPPrioritizedReplayBuffer

    def child(buffer):
        buffer.add(obs=np.zeros(2, np.float32))
        buffer.sample(1)

    if __name__ == "__main__":
        buffer = MPPrioritizedReplayBuffer(8, {"obs": {"shape": (2,)}})
        print(buffer.name, flush=True)
        for method in ("spawn", "fork", "forkserver"):
            p = mp.get_context(method).Process(target=child, args=(buffer,))
            p.start(); p.join()
            assert p.exitcode == 0
        if sys.argv[1] == "close":
            buffer.close()
        elif sys.argv[1] == "raise":
            raise SystemExit(3)
        # "exit": rely on the owner's cleanup at interpreter exit
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["close", "exit", "raise"])
def test_the_segment_is_gone_after_the_owner_ends_and_nothing_warns(ending, tmp_path, no_leak):
    script = tmp_path / "owner.py"
    script.write_text(_SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script), ending], capture_output=True, text=True, timeout=100, check=False
    )
    name = run.stdout.split()[0]
    assert not segment_exists(name)
    assert "resource_tracker" not in run.stderr and "leaked" not in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


_FORKING_OWNER = textwrap.dedent("""
    import os, sys, warnings
    import numpy as np
    from mpreplay import MPPrioritizedReplayBuffer
    buffer = MPPrioritizedReplayBuffer(8, {"obs": {"shape": (2,)}})
    buffer.add(obs=np.zeros(2, np.float32))
    # Python 3.12+ warns, in this process, that it forks with other threads running (numpy's
    # OpenBLAS workers, the owner's termination watchdog); what is checked is what the child prints.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This process .* is multi-threaded, use of fork", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        if sys.argv[1] == "use":
            buffer.add(obs=np.ones(2, np.float32))
            batch = buffer.sample(1)       # arrays over the mapping stay alive until the exit
        elif sys.argv[1] == "close":
            buffer.close()
        sys.exit(0)                        # the interpreter's own exit: atexit, then collection
    _, status = os.waitpid(pid, 0)
    print(buffer.name, os.waitstatus_to_exitcode(status), buffer.get_stored_size(), flush=True)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("child_does", ["use", "close", "nothing"])
def test_a_child_of_os_fork_leaves_quietly_and_the_segment_stays_its_parents(child_does, tmp_path, no_leak):
    script = tmp_path / "forking_owner.py"
    script.write_text(_FORKING_OWNER)
    run = subprocess.run(
        [sys.executable, str(script), child_does], capture_output=True, text=True, timeout=50, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    name, child_status, stored = run.stdout.split()
    assert child_status == "0"
    assert stored == ("2" if child_does == "use" else "1")  # the parent still reads the segment after the child left
    assert not segment_exists(name)  # and unlinks it at its own exit


@pytest.mark.timeout(60)
def test_the_segment_is_gone_after_the_owner_is_killed(tmp_path, no_leak):
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent("""
        import time
        from mpreplay import MPReplayBuffer
        buffer = MPReplayBuffer(8, {"obs": {}})
        print(buffer.name, flush=True)
        time.sleep(60)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = proc.stdout.readline().split()[0]
    assert segment_exists(name)
    proc.kill()
    proc.wait(10)
    # The resource tracker outlives its process and unlinks what it owned.
    deadline = time.monotonic() + 20
    while segment_exists(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not segment_exists(name)


def test_local_and_shared_buffers_store_the_same_bytes(no_leak):
    local = PrioritizedReplayBuffer(8, ENV, seed=3)
    with MPPrioritizedReplayBuffer(8, ENV, seed=3) as shared:
        for b in (local, shared):
            b.add(**rows_of(ENV, np.arange(11)), priorities=np.arange(11) + 0.5)
            b.update_priorities(np.arange(3), np.array([4.0, 5.0, 6.0]))
        shared_arrays = shared.inspection().arrays
        for name, array in local.inspection().arrays.items():
            if name in ("manifest", "writers", "lock"):  # which class, who made it and who wrote
                continue
            kept = slice(LOCK_WAIT_NS) if name == "header" else slice(None)  # the shared lock counts there
            assert shared_arrays[name][kept].tobytes() == array[kept].tobytes(), name
        assert local.sample(16)["id"].tolist() == shared.sample(16)["id"].tolist()


def _own_a_buffer(queue, wait: bool) -> None:
    buffer = own_a_buffer(queue)  # noqa: F841 (alive while the child waits)
    if wait:
        time.sleep(60)
    # returns without close(): the child's exit must unlink the segment


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_buffer_created_in_a_child_is_unlinked_when_the_child_returns(method):
    child, name = start_buffer_owner(method, _own_a_buffer, False)
    child.join(30)
    assert child.exitcode == 0
    assert not segment_exists(name)


@EACH_START_METHOD
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("default_termination_signals")  # as in a program that sets no SIGTERM handler
def test_a_buffer_created_in_a_child_is_unlinked_when_the_child_is_terminated(method):
    child, name = start_buffer_owner(method, _own_a_buffer, True)
    child.terminate()
    child.join(30)
    assert child.exitcode == -signal.SIGTERM, "the child still ends as killed by SIGTERM"
    assert not segment_exists(name)


def _call_every_method(buffer) -> dict[str, Any]:
    rows = rows_of(ENV, np.arange(2))
    return {
        "add": lambda: buffer.add(**rows),
        "add_row": lambda: buffer.add_row({name: row[0] for name, row in rows.items()}),
        "sample": lambda: buffer.sample(2),
        "update_priorities": lambda: buffer.update_priorities(np.arange(2), np.ones(2)),
        "get_all_transitions": buffer.get_all_transitions,
        "save_transitions": lambda: buffer.save_transitions(io.BytesIO()),
        "load_transitions": lambda: buffer.load_transitions(_saved_rows()),
        "checkpoint": lambda: buffer.checkpoint("never-written"),  # refused before the path is looked at
        "writer_state_dict": buffer.writer_state_dict,
        "load_writer_state_dict": lambda: buffer.load_writer_state_dict({}),
        "get_next_index": buffer.get_next_index,
        "get_stored_size": buffer.get_stored_size,
        "get_buffer_size": buffer.get_buffer_size,
        "get_env_dict": buffer.get_env_dict,
        "get_max_priority": buffer.get_max_priority,
        "default_priority": buffer.default_priority,
        "sample_leaves": lambda: buffer.sample_leaves(2),
        "slot_tags": lambda: buffer.slot_tags(np.arange(2)),
        "leaf_mass": buffer.leaf_mass,
        "clear": buffer.clear,
        "on_episode_end": buffer.on_episode_end,
        "episode_writer": buffer.episode_writer,
        "stats": buffer.stats,
        "read": lambda: buffer.read([0]),
        "batches": lambda: buffer.batches(2),
        "verify": buffer.verify,
        "inspection": buffer.inspection,
    }


def _saved_rows() -> io.BytesIO:
    f = io.BytesIO()
    source = PrioritizedReplayBuffer(4, ENV)
    source.add(**rows_of(ENV, np.arange(2)))
    source.save_transitions(f)
    f.seek(0)
    return f


def test_every_method_of_a_closed_buffer_raises_buffer_closed(no_leak):
    buffer = MPPrioritizedReplayBuffer(16, ENV)
    buffer.add(**rows_of(ENV, np.arange(3)))
    calls = _call_every_method(buffer)
    public = {n for n in dir(buffer) if not n.startswith("_") and callable(getattr(buffer, n))} - {"close"}
    assert public == set(calls), "a public method is missing from this test"
    buffer.close()
    for name, call in calls.items():
        with pytest.raises(BufferClosed):
            call()
            pytest.fail(f"{name}() worked on a closed buffer")
