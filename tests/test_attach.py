"""Joining a shared table by name (``mpreplay.attach``): from any process of the same user, with
only the name; waiting for a table not made yet; read-only handles; other users refused.

The lifetimes of tables (persistent or ending with their creator) are test_table_lifetime.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import damage  # tests/damage.py: manifests rewritten in place
import numpy as np
import pytest
from helpers import EACH_START_METHOD, ID_FIELD, OBS_OF_4, REPO_ROOT, run_in_child, segment_exists

import mpreplay
from mpreplay import (
    IncompatibleSegmentError,
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    ReadOnlyError,
    SharedMemoryError,
    Table,
)

pytestmark = pytest.mark.timeout(120, method="thread")

FIELDS = {**OBS_OF_4, **ID_FIELD}


def _rows(ids) -> dict[str, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    return {"obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids}


def _python(script: str, name: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a new Python process (not a multiprocessing child), given only ``name``
    as its argument."""
    return subprocess.run(
        [sys.executable, "-c", script, name], check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_handle_attached_by_name_is_of_the_tables_own_class_and_sees_its_rows(table_name):
    with MPPrioritizedReplayBuffer(64, FIELDS, name=table_name, alpha=0.7) as table:
        table.add(**_rows(range(5)), priorities=np.arange(1.0, 6.0))
        handle = mpreplay.attach(table_name, timeout=0)
        assert type(handle) is MPPrioritizedReplayBuffer
        assert (handle.name, handle.alpha, handle.config) == (table.name, 0.7, table.config)
        assert sorted(handle.get_all_transitions()["id"].tolist()) == [0, 1, 2, 3, 4]
        handle.add(**_rows([5]), priorities=[9.0])
        assert table.get_stored_size() == 6
        handle.close()


# Tables of every part the constructor takes: attached by name, each gets the creator's configuration.
KINDS = {
    "n-step, float64 default": lambda name: mpreplay.MPReplayBuffer(
        64,
        {"obs": {"shape": (2,)}, "rew": {}, "next_obs": {"shape": (2,)}, "done": {}},
        nstep={"size": 3, "gamma": np.float32(0.9)},
        default_dtype=np.float64,
        name=name,
    ),
    "compressed stacks in lanes": lambda name: mpreplay.MPPrioritizedReplayBuffer(
        64,
        {"obs": {"shape": (3, 3, 4), "dtype": np.uint8}, "next_obs": {"shape": (3, 3, 4), "dtype": np.uint8}},
        next_of="obs",
        stack_compress="obs",
        lanes=2,
        alpha=np.float64(0.5),
        name=name,
    ),
    "sequences": lambda name: mpreplay.MPPrioritizedSequenceReplayBuffer(
        64, {"obs": {}, "done": {}}, length=4, period=2, eta=0.8, lanes=2, name=name
    ),
    "queue, float32 weights": lambda name: Table(
        16, {"obs": {}}, rate_limiter=mpreplay.Queue(16), shared=True, name=name, indexes_dtype=np.uint64
    ),
    "max heap, retired": lambda name: Table(
        16, {"obs": {}}, selector="max_heap", max_times_sampled=2, shared=True, name=name, weights_dtype="float32"
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_table_attaches_by_name_with_its_creators_configuration(kind, table_name):
    with KINDS[kind](table_name) as table, mpreplay.attach(table_name, timeout=0) as handle:
        assert type(handle) is type(table)
        assert handle.config == table.config
        assert handle.inspection().arrays.keys() == table.inspection().arrays.keys()


def test_the_segment_of_a_named_table_is_mpreplay_and_its_name(table_name):
    with MPReplayBuffer(8, FIELDS, name=table_name) as table:
        assert table.name == f"mpreplay-{table_name}"
        handle = mpreplay.attach(table.name, timeout=0)  # the segment's name joins it too
        handle.close()


def test_a_process_started_with_only_the_name_adds_and_samples(table_name):
    script = (
        "import sys, numpy as np, mpreplay\n"
        "t = mpreplay.attach(sys.argv[1], timeout=10)\n"
        "t.add(obs=np.full(4, 7.0), id=7)\n"
        "print(type(t).__name__, sorted(t.sample(64)['id'].tolist())[-1], t.get_stored_size())\n"
        "t.close()\n"
    )
    with Table(64, FIELDS, selector="fifo", shared=True, name=table_name) as table:
        table.add(**_rows([1, 2, 3]))
        done = _python(script, table_name)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["Table", "7", "4"]
        assert table.get_all_transitions()["id"].tolist() == [1, 2, 3, 7]


def _create_later(name: str, delay: float) -> None:
    time.sleep(delay)
    table = MPReplayBuffer(8, FIELDS, name=name, persist=True)
    table.add(**_rows([42]))
    table.close()


@EACH_START_METHOD
def test_attach_waits_for_a_table_made_later_by_another_process(method, table_name):
    maker = threading.Thread(target=run_in_child, args=(method, _create_later, table_name, 0.5))
    maker.start()
    try:
        handle = mpreplay.attach(table_name, timeout=60)
        # It attached once the table was whole: the manifest is written last.
        deadline = time.monotonic() + 30
        while handle.get_stored_size() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.get_all_transitions()["id"].tolist() == [42]
        handle.close(unlink=True)
    finally:
        maker.join(60)


def test_attach_with_timeout_0_refuses_a_missing_table_at_once(table_name):
    start = time.monotonic()
    with pytest.raises(SharedMemoryError, match=f"no table called '{table_name}'"):
        mpreplay.attach(table_name, timeout=0)
    assert time.monotonic() - start < 1.0


def test_attach_gives_up_on_a_missing_table_after_its_timeout(table_name):
    start = time.monotonic()
    with pytest.raises(SharedMemoryError, match=r"appeared within 0\.3 s"):
        mpreplay.attach(table_name, timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"timeout": -1}, ValueError, "timeout"),
        ({"timeout": "1"}, TypeError, "timeout"),
        ({"readonly": 1}, TypeError, "readonly"),
    ],
)
def test_attach_refuses_bad_arguments_by_name(table_name, arguments, error, message):
    with pytest.raises(error, match=message):
        mpreplay.attach(table_name, **arguments)


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", "-option", "x" * 201, "sp ace"])
def test_attach_refuses_a_name_no_table_can_have(name):
    with pytest.raises(ValueError, match="name: expected 1 to 200 letters"):
        mpreplay.attach(name, timeout=0)


def test_a_second_table_of_the_same_name_is_refused(table_name):
    with (
        MPReplayBuffer(8, FIELDS, name=table_name),
        pytest.raises(SharedMemoryError, match=r"exists already: join its table with mpreplay\.attach"),
    ):
        MPReplayBuffer(8, FIELDS, name=table_name)


def test_a_local_table_takes_no_name_and_does_not_persist(table_name):
    with pytest.raises(ValueError, match="name: only a shared table"):
        Table(8, FIELDS, name=table_name)
    with pytest.raises(ValueError, match="persist: only a shared table"):
        Table(8, FIELDS, persist=True)


def test_a_table_of_another_minor_version_is_refused_naming_both(table_name):
    other = damage.setting("mpreplay_version", "0.0.1+other")
    with (
        MPReplayBuffer(8, FIELDS, name=table_name) as table,
        damage.manifest_rewritten(table.name, other),
        pytest.raises(IncompatibleSegmentError, match=r"made by mpreplay 0\.0\.1\+other.*minor version"),
    ):
        mpreplay.attach(table_name, timeout=0)


def test_a_table_whose_arguments_give_another_layout_is_refused(table_name):
    def other_capacity(document):
        document["build"]["size"] = 16

    with (
        MPReplayBuffer(8, FIELDS, name=table_name) as table,
        damage.manifest_rewritten(table.name, other_capacity),
        pytest.raises(IncompatibleSegmentError, match="'capacity' is 8 in the segment, 16 expected"),
    ):
        mpreplay.attach(table_name, timeout=0)


def test_attaching_and_closing_leaves_no_descriptor_or_segment(table_name):
    before = _open_fds()
    table = MPReplayBuffer(8, FIELDS, name=table_name)
    for readonly in (False, True):
        mpreplay.attach(table_name, readonly=readonly, timeout=0).close()
    table.close()
    assert not segment_exists(table.name)
    assert _open_fds() == before


# -- read-only handles ---------------------------------------------------------------------------


@pytest.fixture
def prioritized_and_reader(table_name):
    """A shared prioritized table of 8 rows and a read-only handle on it."""
    with MPPrioritizedReplayBuffer(32, FIELDS, name=table_name) as table:
        table.add(**_rows(range(8)), priorities=np.arange(1.0, 9.0))
        reader = mpreplay.attach(table_name, readonly=True, timeout=0)
        yield table, reader
        reader.close()


def test_a_read_only_handle_samples_reads_and_inspects(prioritized_and_reader):
    table, reader = prioritized_and_reader
    batch = reader.sample(4)
    assert set(batch) == {"obs", "id", "indexes", "weights"}
    assert (reader.read(batch["indexes"])["id"] == batch["id"]).all()
    assert sorted(reader.get_all_transitions()["id"].tolist()) == list(range(8))
    assert reader.verify()["complete"] == 8
    assert reader.stats()["stored"] == 8
    assert reader.inspection().total_weight == table.inspection().total_weight


WRITES = {
    "add": lambda t: t.add(obs=np.zeros(4), id=1),
    "add with priorities": lambda t: t.add(obs=np.zeros(4), id=1, priorities=2.0),
    "add_row": lambda t: t.add_row({"obs": np.zeros(4, np.float32), "id": 1}),
    "update_priorities": lambda t: t.update_priorities(np.array([0]), np.array([3.0])),
    "clear": lambda t: t.clear(),
    "on_episode_end": lambda t: t.on_episode_end(),
    "load_transitions": lambda t: t.load_transitions(damage.io.BytesIO()),
    "episode_writer": lambda t: t.episode_writer(),
    "close(unlink=True)": lambda t: t.close(unlink=True),
}


@pytest.mark.parametrize("call", sorted(WRITES))
def test_a_read_only_handle_refuses_every_write_by_name_and_changes_nothing(prioritized_and_reader, unchanged, call):
    table, reader = prioritized_and_reader
    with unchanged(table), pytest.raises(ReadOnlyError, match=r"\(mpreplay.attach\(name, readonly=True\)\)"):
        WRITES[call](reader)
    assert reader.sample(2)["id"].shape == (2,)  # still open


def test_a_read_only_handle_never_claims_a_lane_nor_counts_as_a_writer(table_name):
    fields = {"obs": {"shape": (4,)}, "done": {}}
    with MPReplayBuffer(64, fields, next_of="obs", lanes=2, name=table_name) as table:
        table.add(obs=np.ones((3, 4)), next_obs=np.ones((3, 4)) * 2, done=[0.0, 0.0, 1.0])
        lanes, writers = (table.inspection().arrays[a].copy() for a in ("lanes", "writers"))
        reader = mpreplay.attach(table_name, readonly=True, timeout=0)
        reader.sample(2)
        reader.get_all_transitions()
        assert (table.inspection().arrays["lanes"] == lanes).all()
        assert (table.inspection().arrays["writers"] == writers).all()
        reader.close()
        # Both lanes are still free for writers of other processes.
        assert run_in_child("spawn", _write_one_episode, table) == 0


def _write_one_episode(table) -> None:
    table.add(obs=np.ones((2, 4)), next_obs=np.ones((2, 4)), done=[0.0, 1.0])


# -- other users -----------------------------------------------------------------------------------


def test_a_tables_segment_is_readable_and_writable_by_its_owner_only(table_name):
    with MPReplayBuffer(8, FIELDS, name=table_name) as table:
        assert os.stat(damage.path(table.name)).st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")
def test_another_user_cannot_attach(table_name):
    # The child loads Python and mpreplay first (the interpreter may lie where only root reads),
    # then becomes nobody, and only then looks for the table.
    script = (
        "import os, sys, mpreplay\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    mpreplay.attach(sys.argv[1], timeout=0)\n"
        "except mpreplay.SharedMemoryError as exc:\n"
        "    print('refused:', exc)\n"
    )
    with MPReplayBuffer(8, FIELDS, name=table_name):
        done = _python(script, table_name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "belongs to another user" in done.stdout
