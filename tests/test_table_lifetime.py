"""How long a shared table lives: a persistent one outlives its creator (SIGKILLed at any fault
site of the write and sample paths, a new process attaches and finds every published row) until
``close(unlink=True)`` or ``mpreplay rm``; one that is not persistent ends with its creator, and
its surviving handles' calls raise TableGone instead of writing rows nobody will read."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, ID_FIELD, OBS_OF_4, run_in_child, segment_exists

import mpreplay
from mpreplay import (
    BufferClosed,
    MinSize,
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    TableGone,
)
from mpreplay.inspect import arm_fault
from mpreplay.monitor import remove_segments

pytestmark = pytest.mark.timeout(120, method="thread")

FIELDS = {**OBS_OF_4, **ID_FIELD}
CAPACITY = 64
# Each row's priority in the model: what the creator gave it.
MODEL = {i: 1.0 + i % 7 for i in range(CAPACITY)}
NEW_IDS = range(1000, 1008)  # what the creator was adding when it died
TOUCHED = range(8)  # the rows that add was replacing (the oldest of the full ring)
UPDATED = 5.0  # the priority the creator was setting when it died


def _rows(ids) -> dict[str, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    return {"obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids}


def _eventually_raises(call, error: type[BaseException], seconds: float = 10.0) -> BaseException:
    """Calls ``call()`` until it raises ``error`` (within ``seconds``); the error."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            call()
        except error as exc:
            return exc
        time.sleep(0.02)
    raise AssertionError(f"{call} never raised {error.__name__} in {seconds} s")


# -- persistent tables ---------------------------------------------------------------------------


def _add(table) -> None:
    table.add(**_rows(NEW_IDS), priorities=np.full(len(NEW_IDS), 2.0))


def _update(table) -> None:
    batch = table.sample(8)
    table.update_priorities(batch["indexes"], np.full(8, UPDATED))


def _sample(table) -> None:
    table.sample(8)


# What the creator does once armed: each reaches its site with the lock held.
ACTIONS = {"reserve": _add, "publish": _add, "retire": _add, "update": _update, "draw": _sample}


def _create_and_die_at(name: str, site: str) -> None:
    """A child's target: creates the persistent table ``name`` holding the model, then dies at ``site``."""
    table = MPPrioritizedReplayBuffer(CAPACITY, FIELDS, name=name, persist=True)
    table.add(**_rows(list(MODEL)), priorities=np.array(list(MODEL.values())))
    arm_fault(site)
    ACTIONS[site](table)
    os._exit(3)  # not reached: the armed site kills the process


@EACH_START_METHOD
@pytest.mark.parametrize("site", sorted(ACTIONS))
def test_a_persistent_table_keeps_every_published_row_when_its_creator_dies_at_each_site(method, site, table_name):
    assert run_in_child(method, _create_and_die_at, table_name, site, timeout=60) == -signal.SIGKILL
    table = mpreplay.attach(table_name, timeout=0)
    try:
        report = table.verify()  # its first lock acquisition repairs what the creator left
        rows = table.get_all_transitions(indexes=True)
        ids = rows["id"].tolist()
        assert (rows["obs"] == rows["id"][:, None]).all()  # no torn row
        assert report["complete"] == len(ids) == table.get_stored_size()
        # Every row the dying call could not touch is there with its priority; what it touched is
        # either still the old row or one of its own new rows.
        untouched = [i for i in MODEL if not (ACTIONS[site] is _add and i in TOUCHED)]
        assert set(untouched) <= set(ids)
        assert set(ids) - set(untouched) <= set(TOUCHED) | set(NEW_IDS)
        priorities = dict(zip(ids, table.inspection().priorities(rows["indexes"])[1].tolist(), strict=True))
        for i in untouched:
            allowed = {MODEL[i], UPDATED} if site == "update" else {MODEL[i]}
            assert priorities[i] in allowed, f"row {i}: priority {priorities[i]}, model {MODEL[i]}"
        assert table.stats()["lock_recoveries"] == 1  # every site is inside the lock
        # ... and it goes on: adds and samples at once.
        table.add(**_rows([2000, 2001]), priorities=[50.0, 50.0])
        assert {2000, 2001} <= set(table.get_all_transitions()["id"].tolist())
        assert table.sample(16, timeout=10)["id"].shape == (16,)
        table.verify()
    finally:
        table.close(unlink=True)


STEP_FIELDS = {**OBS_OF_4, **ID_FIELD, "done": {}}


def _steps(ids, done_last: bool) -> dict[str, np.ndarray]:
    rows = _rows(ids)
    rows["done"] = np.zeros(len(rows["id"]))
    rows["done"][-1] = float(done_last)
    return rows


def _compressed_dies_completing(name: str) -> None:
    """A child's target: a persistent compressed table holding one whole episode (ids 0-2) and a
    step waiting for its next frame (10); dies storing the step that completes it."""
    table = MPPrioritizedReplayBuffer(
        CAPACITY, {**STEP_FIELDS, "next_obs": {"shape": (4,)}}, name=name, persist=True, next_of="obs", lanes=2
    )
    episode = _steps([0, 1, 2], True)
    table.add(**episode, next_obs=episode["obs"] + 1)
    table.add(**_steps([10], False), next_obs=_rows([11])["obs"])
    arm_fault("complete")
    table.add(**_steps([11], False), next_obs=_rows([12])["obs"])
    os._exit(3)


def _sequences_die_opening(name: str) -> None:
    """A child's target: a persistent sequence table holding one whole sequence (ids 0-3); dies
    storing the step that opens the next (ids 10-13)."""
    table = MPPrioritizedSequenceReplayBuffer(CAPACITY, STEP_FIELDS, length=4, name=name, persist=True, lanes=2)
    table.add(**_steps([0, 1, 2, 3], True))
    table.add(**_steps([10, 11, 12], False))
    arm_fault("open")
    table.add(**_steps([13], False))
    os._exit(3)


@EACH_START_METHOD
@pytest.mark.parametrize("layout", ["compressed", "sequences"])
def test_a_persistent_table_keeps_its_rows_when_its_creator_dies_completing_or_opening_items(
    method, layout, table_name
):
    target, published = {
        "compressed": (_compressed_dies_completing, {0, 1, 2}),
        "sequences": (_sequences_die_opening, {0, 1, 2, 3}),
    }[layout]
    assert run_in_child(method, target, table_name, timeout=60) == -signal.SIGKILL
    table = mpreplay.attach(table_name, timeout=0)
    try:
        table.verify()
        rows = table.get_all_transitions()
        assert (rows["obs"] == rows["id"][:, None]).all()
        assert published <= set(rows["id"].tolist()) <= published | {10, 11, 12, 13}
        # It goes on: a new episode from this process, then draws.
        table.add(
            **_steps([20, 21, 22, 23], True),
            **({"next_obs": _rows([21, 22, 23, 24])["obs"]} if layout == "compressed" else {}),
        )
        assert {20, 21, 22, 23} <= set(table.get_all_transitions()["id"].tolist())
        assert len(table.sample(8, timeout=10)["id"]) == 8
        table.verify()
    finally:
        table.close(unlink=True)


def _create_and_exit(name: str) -> None:
    table = MPReplayBuffer(8, FIELDS, name=name, persist=True)
    table.add(**_rows([1, 2]))
    table.close()  # a persistent table's creator only lets go of it


@EACH_START_METHOD
def test_a_persistent_table_stays_when_its_creator_closes_and_exits(method, table_name):
    assert run_in_child(method, _create_and_exit, table_name) == 0
    table = mpreplay.attach(table_name, timeout=0)
    assert table.get_all_transitions()["id"].tolist() == [1, 2]
    table.close(unlink=True)
    assert not segment_exists(f"mpreplay-{table_name}")


def test_a_persistent_table_removed_by_one_handle_is_gone_for_the_others(table_name):
    creator = MPReplayBuffer(8, FIELDS, name=table_name, persist=True)
    other = mpreplay.attach(table_name, timeout=0)
    other.close(unlink=True)
    error = _eventually_raises(lambda: creator.add(**_rows([1])), TableGone)
    assert "removed" in str(error)
    creator.close()


def test_a_persistent_table_removed_by_mpreplay_rm_is_gone_for_its_handles(table_name):
    table = MPReplayBuffer(8, FIELDS, name=table_name, persist=True)
    table.add(**_rows([1]))
    # Its creator is alive, and no --force is needed: a persistent table is nobody's.
    (removal,) = remove_segments([table.name])
    assert removal.removed, removal.reason
    assert isinstance(_eventually_raises(lambda: table.sample(1), BufferClosed), TableGone)
    table.close()


def test_unlink_is_refused_where_it_cannot_be_done(table_name):
    with MPReplayBuffer(8, FIELDS, name=table_name) as creator:
        handle = mpreplay.attach(table_name, timeout=0)
        with pytest.raises(ValueError, match="unlink: a table that is not persistent is unlinked by its creator"):
            handle.close(unlink=True)
        with pytest.raises(ValueError, match="unlink: a table that is not persistent ends with its creator"):
            creator.close(unlink=False)
        handle.close()
        assert creator.get_stored_size() == 0  # both refusals left it open


# -- tables that end with their creator ----------------------------------------------------------


def _create_and_wait(name: str, ready, limited: bool) -> None:
    table = MPReplayBuffer(8, FIELDS, name=name, rate_limiter=MinSize(4) if limited else None)
    ready.set()
    time.sleep(120)  # the test kills it first
    table.close()


def _start_creator(method: str, name: str, *, limited: bool = False):
    ctx = mp.get_context(method)
    ready = ctx.Event()
    creator = ctx.Process(target=_create_and_wait, args=(name, ready, limited))
    creator.start()
    assert ready.wait(60), "the creator never made its table"
    return creator


@EACH_START_METHOD
def test_the_handles_of_a_table_whose_creator_died_raise_table_gone(method, table_name):
    creator = _start_creator(method, table_name)
    handle = mpreplay.attach(table_name, timeout=0)
    handle.add(**_rows([1]))
    creator.kill()
    creator.join(30)
    error = _eventually_raises(lambda: handle.add(**_rows([2])), TableGone)
    assert "creator died" in str(error) and "persist=True" in str(error)
    with pytest.raises(TableGone):  # every call, not just the one that found out
        handle.sample(1)
    handle.close()


@EACH_START_METHOD
def test_a_call_blocked_when_the_creator_dies_raises_table_gone(method, table_name):
    creator = _start_creator(method, table_name, limited=True)
    handle = mpreplay.attach(table_name, timeout=0)
    threading.Timer(0.3, creator.kill).start()
    with pytest.raises(TableGone, match="creator died"):
        handle.sample(1)  # waits for MinSize(4), with no timeout
    creator.join(30)
    handle.close()


def test_a_table_without_persist_is_gone_once_its_creator_closed_it(table_name):
    creator = MPReplayBuffer(8, FIELDS, name=table_name)
    handle = mpreplay.attach(table_name, timeout=0)
    creator.close()
    assert not segment_exists(f"mpreplay-{table_name}")
    with pytest.raises(BufferClosed, match="closed by its owner"):
        handle.add(**_rows([1]))
    handle.close()
