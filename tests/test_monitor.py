"""``mpreplay ls``, ``top`` and ``rm``: the buffers of this machine, seen from another process."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time

import damage  # tests/damage.py: a segment's bytes
import numpy as np
import pytest
from helpers import EACH_START_METHOD, OBS_OF_4, START_METHODS, start_lock_holder

from mpreplay import MPPrioritizedReplayBuffer, MPPrioritizedSequenceReplayBuffer, MPReplayBuffer, SampleToInsertRatio
from mpreplay.cli import main
from mpreplay.monitor import SHM_DIR, BufferView, list_segments, remove_segments

ENV = OBS_OF_4
pytestmark = pytest.mark.timeout(120, method="thread")


def _own(queue, stop, rows: int) -> None:
    buffer = MPPrioritizedReplayBuffer(1000, ENV, rate_limiter=SampleToInsertRatio(4.0, 10, 1e8))
    buffer.add(obs=np.ones((rows, 4)), priorities=np.linspace(0.5, 2.0, rows))
    queue.put(buffer)
    stop.wait(60)
    buffer.close()


@pytest.fixture
def owned(request):
    """``(buffer handle, owner process)``: a buffer a child created (spawn or fork) and wrote
    100 rows into, attached here."""
    ctx = mp.get_context(request.param)
    queue, stop = ctx.Queue(), ctx.Event()
    owner = ctx.Process(target=_own, args=(queue, stop, 100))
    owner.start()
    buffer = queue.get(timeout=60)
    try:
        yield buffer, owner
    finally:
        buffer.close()
        stop.set()
        owner.join(30)
        if owner.exitcode is None:
            owner.kill()


OWNED = pytest.mark.parametrize("owned", START_METHODS, indirect=True)


def _ls(capsys) -> list[dict]:
    assert main(["ls", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _row(rows: list[dict], name: str) -> dict:
    (row,) = [r for r in rows if r["name"] == name]
    return row


@OWNED
def test_ls_lists_a_buffer_another_process_made_with_its_figures(owned, capsys):
    buffer, owner = owned
    buffer.add(obs=np.zeros((50, 4)), priorities=np.ones(50))  # this process writes too
    row = _row(_ls(capsys), buffer.name)
    assert (row["owner_pid"], row["owner_alive"], row["kind"]) == (owner.pid, True, "prioritized")
    assert (row["capacity"], row["stored"], row["writers_alive"]) == (1000, 150, 2)
    assert (row["persistent"], row["attached"]) == (False, 2)  # the owner and this process
    assert row["bytes"] >= os.stat(os.path.join(SHM_DIR, buffer.name)).st_size


@OWNED
def test_ls_prints_one_line_per_segment(owned, capsys):
    buffer, owner = owned
    assert main(["ls"]) == 0
    (line,) = [row for row in capsys.readouterr().out.splitlines() if row.startswith(buffer.name)]
    assert re.search(rf"{owner.pid} \(alive\)\s+creator's\s+[\d.]+ MiB\s+prioritized\s+100 / 1,000\s+2\s+1\s", line)


def test_ls_names_a_compressed_uniform_buffer_as_such(capsys):
    with MPReplayBuffer(
        1000, {"obs": {"shape": (4, 2)}, "next_obs": {"shape": (4, 2)}}, next_of="obs", stack_compress="obs"
    ) as buffer:
        assert _row(_ls(capsys), buffer.name)["kind"] == "uniform, compressed"


def test_ls_names_a_sequence_buffer_and_its_length(capsys):
    with MPPrioritizedSequenceReplayBuffer(1000, {"obs": {"shape": (2,)}, "done": {}}, length=8) as buffer:
        assert _row(_ls(capsys), buffer.name)["kind"] == "prioritized, sequences of 8"


def _write_forever(buffer, stop) -> None:
    # `stop` is a lock-free flag: a writer killed while reading it leaves nothing held.
    while not stop.value:
        buffer.add(obs=np.ones((8, 4)), priorities=np.linspace(0.5, 2.0, 8))


@OWNED
def test_top_once_shows_rates_fill_limiter_writers_and_priorities(owned, capsys):
    buffer, owner = owned
    ctx = mp.get_context("fork")
    stop = ctx.Value("b", 0, lock=False)
    writer = ctx.Process(target=_write_forever, args=(buffer, stop))
    writer.start()
    try:
        assert main(["top", buffer.name, "--once", "--interval", "0.5", "--plain"]) == 0
    finally:
        stop.value = 1
        writer.join(30)
    out = capsys.readouterr().out
    assert re.search(r"inserts/s\s+[1-9][\d,]*\n", out)
    assert re.search(r"fill\s+[\d,]+ / 1,000", out)
    assert "target 4, min size 10" in out
    assert re.search(rf"writer\s+pid {writer.pid}: [1-9][\d,]* inserts/s", out)
    assert re.search(rf"writer\s+pid {owner.pid}: 0 inserts/s \(100 in all\)", out)
    assert re.search(r"priorities\s+min 0\.5\s+median [\d.]+\s+max 2\n", out)
    assert re.search(r"lifetime\s+ends with its creator\n", out)
    # The owner and the writer, both writing (top leaves itself out).
    assert re.search(r"attached\s+2 processes: 2 writing, 0 reading only", out)


def test_top_without_a_name_watches_the_newest_live_buffer(capsys):
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        assert main(["top", "--once", "--interval", "0.1", "--plain"]) == 0
        assert buffer.name in capsys.readouterr().out


def test_top_of_a_segment_that_is_not_there_fails_with_a_message(capsys):
    assert main(["top", "mpreplay-0-00000000", "--once", "--plain"]) == 1
    assert "mpreplay-0-00000000" in capsys.readouterr().err


def test_top_falls_back_to_plain_text_when_rich_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich... raises ImportError
    monkeypatch.setitem(sys.modules, "rich.console", None)
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        assert main(["top", buffer.name, "--once", "--interval", "0.1"]) == 0
        assert re.search(rf"buffer\s+{buffer.name}  MPPrioritizedReplayBuffer", capsys.readouterr().out)


@EACH_START_METHOD
def test_top_goes_on_when_a_writer_is_killed_mid_run_and_shows_it_gone(method, capsys):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(1000, ENV) as buffer:
        stop = ctx.Value("b", 0, lock=False)
        writer = ctx.Process(target=_write_forever, args=(buffer, stop))
        writer.start()
        try:
            while buffer.get_stored_size() < 64 and writer.is_alive():
                time.sleep(0.01)
            os.kill(writer.pid, signal.SIGKILL)  # perhaps inside its reservation, perhaps holding the lock
            writer.join(30)
            assert main(["top", buffer.name, "--once", "--interval", "0.2", "--plain"]) == 0
        finally:
            stop.value = 1
        assert re.search(rf"writer\s+pid {writer.pid}: 0 inserts/s \([\d,]+ in all, gone\)", capsys.readouterr().out)
        buffer.add(obs=np.ones(4))  # the buffer goes on too


@EACH_START_METHOD
def test_top_reads_a_buffer_whose_lock_a_stopped_process_holds_and_names_it(method, capsys):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        holder = start_lock_holder(ctx, buffer)
        try:
            os.kill(holder.pid, signal.SIGSTOP)
            assert main(["top", buffer.name, "--once", "--interval", "0.1", "--plain"]) == 0
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(30)
        assert re.search(rf"lock holder\s+process {holder.pid} \(stopped\) for [\d,.]+ ms", capsys.readouterr().out)


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_top_counts_the_lock_holders_that_died_once_repaired(method, capsys):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        assert main(["top", buffer.name, "--once", "--interval", "0.1", "--plain"]) == 0
        assert "lock recoveries" not in capsys.readouterr().out  # none died: no row
        for _ in range(2):
            holder = start_lock_holder(ctx, buffer)
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(30)
            buffer.add(obs=np.ones(4))  # takes the lock over and repairs
        assert main(["top", buffer.name, "--once", "--interval", "0.1", "--plain"]) == 0
        assert re.search(r"lock recoveries\s+2 \(holders that died", capsys.readouterr().out)


def test_ls_and_top_change_no_byte_of_the_segment_and_never_take_its_lock(capsys):
    with MPPrioritizedReplayBuffer(64, ENV) as buffer:
        buffer.add(obs=np.ones((8, 4)))
        before = damage.segment_bytes(buffer)
        main(["ls"])
        main(["top", buffer.name, "--once", "--interval", "0.1", "--plain"])
        assert damage.segment_bytes(buffer) == before  # the lock's hold counter included


def _own_and_die(queue) -> None:
    buffer = MPReplayBuffer(64, ENV)
    queue.put(buffer.name)
    time.sleep(120)


@EACH_START_METHOD
def test_rm_dead_removes_the_segment_of_a_killed_owner_and_keeps_a_live_one(method, capsys):
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    owner = ctx.Process(target=_own_and_die, args=(queue,))
    owner.start()
    dead = queue.get(timeout=60)
    os.kill(owner.pid, signal.SIGKILL)
    owner.join(30)
    with MPReplayBuffer(64, ENV) as live:
        assert _row(_ls(capsys), dead)["owner_alive"] is False
        assert main(["rm", "--dead"]) == 0
        out = capsys.readouterr().out
        assert f"removed {dead}" in out and re.search(r"[1-9]\d* removed, [\d.]+ MiB returned", out)
        names = {s.name for s in list_segments()}
        assert dead not in names and live.name in names


def test_rm_refuses_a_segment_whose_owner_is_alive_and_says_why(capsys):
    with MPReplayBuffer(64, ENV) as buffer:
        assert main(["rm", buffer.name]) == 1
        kept = rf"kept {buffer.name}: its owner, process {os.getpid()} \(\w+\), is alive"
        assert re.search(kept, capsys.readouterr().out)
        assert buffer.name in {s.name for s in list_segments()}


def test_rm_force_removes_a_live_owners_segment():
    buffer = MPReplayBuffer(64, ENV)
    (done,) = remove_segments([buffer.name], force=True)
    assert done.removed and done.nbytes > 0
    assert not os.path.exists(os.path.join(SHM_DIR, buffer.name))
    buffer.close()  # the owner finds its segment gone and carries on


def test_rm_of_an_unknown_name_reports_it_and_fails(capsys):
    assert main(["rm", "mpreplay-0-00000000"]) == 1
    assert "no mpreplay segment named 'mpreplay-0-00000000'" in capsys.readouterr().out


def test_rm_removes_nothing_when_one_of_the_names_is_refused(capsys):
    with MPReplayBuffer(64, ENV) as live:
        dead = MPReplayBuffer(64, ENV)
        assert main(["rm", "--force", dead.name, "mpreplay-0-00000000"]) == 1
        out = capsys.readouterr().out
        assert f"kept {dead.name}: another name was refused, so nothing was removed" in out
        assert {dead.name, live.name} <= {s.name for s in list_segments()}
        dead.close()


def test_rm_wants_names_or_dead_but_not_both():
    with pytest.raises(SystemExit):
        main(["rm"])
    with pytest.raises(SystemExit):
        main(["rm", "--dead", "mpreplay-0-00000000"])


def test_a_segment_without_a_manifest_is_listed_as_other_and_cannot_be_watched(tmp_path):
    name = "mpreplay-1-deadbeef"
    (tmp_path / name).write_bytes(bytes(64))
    (segment,) = list_segments(str(tmp_path))
    assert (segment.name, segment.kind, segment.owner_pid) == (name, "other", 1)
    with pytest.raises(ValueError, match="not a replay buffer"):
        BufferView(name, str(tmp_path))


# -- tables joined by name -------------------------------------------------------------------------


def test_ls_shows_a_persistent_table_and_counts_the_processes_attached(table_name, capsys):
    table = MPReplayBuffer(8, OBS_OF_4, name=table_name, persist=True)
    try:
        row = _row(_ls(capsys), table.name)
        assert (row["persistent"], row["attached"], row["writers_alive"]) == (True, 1, 0)
        assert main(["ls"]) == 0
        (line,) = [r for r in capsys.readouterr().out.splitlines() if r.startswith(table.name)]
        assert re.search(r"\(alive\)\s+persistent\s", line)
    finally:
        table.close(unlink=True)


def test_attach_command_prints_what_a_joining_process_gets(table_name, capsys):
    with MPPrioritizedReplayBuffer(8, OBS_OF_4, name=table_name, alpha=0.5):
        assert main(["attach", table_name]) == 0
    out = capsys.readouterr().out
    assert f"mpreplay-{table_name}  MPPrioritizedReplayBuffer" in out
    assert re.search(r"lifetime\s+ends with its creator", out)
    assert re.search(r'selector\s+\{"name": "prioritized", "alpha": 0.5', out)
    assert f"mpreplay.attach('{table_name}')" in out


def test_attach_command_reports_a_missing_table_and_fails(table_name, capsys):
    assert main(["attach", table_name]) == 1
    assert "No such file" in capsys.readouterr().err


def _create_persistent(name: str) -> None:
    MPReplayBuffer(8, OBS_OF_4, name=name, persist=True).close()


def test_rm_dead_keeps_a_persistent_table_whose_creator_is_gone_and_rm_name_removes_it(table_name):
    child = mp.get_context("spawn").Process(target=_create_persistent, args=(table_name,))
    child.start()
    child.join(60)
    segment = f"mpreplay-{table_name}"
    assert segment not in {r.name for r in remove_segments(None, dead=True)}
    assert os.path.exists(os.path.join(SHM_DIR, segment))
    (removal,) = remove_segments([segment])
    assert removal.removed and not os.path.exists(os.path.join(SHM_DIR, segment))
