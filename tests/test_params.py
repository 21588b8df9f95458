"""ParameterStore: versioned publish/read, validation, handles, and the seqlock across processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, run_in_child, segment_exists

from mpreplay.params import ParameterStore, ParameterStoreTimeout


def template():
    return {"w": np.zeros((3, 2), np.float32), "b": np.arange(4, dtype=np.int64)}


def params(value):
    return {"w": np.full((3, 2), value, np.float32), "b": np.full(4, value, np.int64)}


def assert_params_equal(got, expected):
    assert list(got) == list(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.fixture
def store():
    with ParameterStore(template()) as store:
        yield store


# ------------------------------------------------------------------ one process


def test_the_template_is_version_0(store):
    got, version = store.read()
    assert (version, store.version) == (0, 0)
    assert_params_equal(got, template())


def test_publish_then_read_round_trips_values_in_the_template_dtypes(store):
    store.publish({"w": np.full((3, 2), 1.5), "b": [7, 7, 7, 7]})  # float64 and a list: stored as float32, int64
    got, _ = store.read()
    assert_params_equal(got, {"w": np.full((3, 2), 1.5, np.float32), "b": np.full(4, 7, np.int64)})


def test_each_publish_returns_the_next_version(store):
    assert [store.publish(params(v)) for v in range(3)] == [1, 2, 3]
    assert store.version == 3
    assert store.read()[1] == 3


def test_read_returns_copies_not_views(store):
    got, _ = store.read()
    store.publish(params(5))
    assert_params_equal(got, template())


def test_read_into_out_fills_and_returns_it(store):
    store.publish(params(2))
    out = {"w": np.empty((3, 2), np.float32), "b": np.empty(4, np.int64)}
    got, version = store.read(out)
    assert got is out and version == 1
    assert_params_equal(out, params(2))


def test_read_if_newer_is_none_until_a_newer_version_exists(store):
    assert store.read_if_newer(0) is None
    store.publish(params(3))
    got, version = store.read_if_newer(0)
    assert version == 1
    assert_params_equal(got, params(3))
    assert store.read_if_newer(version) is None


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([1, 2], TypeError, "params: expected a mapping"),
        ({"w": np.zeros((3, 2))}, ValueError, r"params: expected the keys \['w', 'b'\]; missing \['b'\], unknown \[\]"),
        ({**params(1), "x": np.zeros(1)}, ValueError, r"missing \[\], unknown \['x'\]"),
        (
            {"w": np.zeros((2, 3)), "b": np.zeros(4, np.int64)},
            ValueError,
            r"params\['w'\]: expected shape \(3, 2\), got \(2, 3\)",
        ),
        ({"w": np.zeros((3, 2)), "b": np.zeros(4)}, TypeError, r"params\['b'\]: cannot store dtype float64 as int64"),
        ({"w": np.zeros((3, 2)), "b": np.array(["a"] * 4)}, TypeError, r"params\['b'\]: expected a numeric array"),
    ],
)
def test_bad_publish_raises_and_changes_nothing(store, bad, error, match):
    store.publish(params(1))
    with pytest.raises(error, match=match):
        store.publish(bad)
    got, version = store.read()
    assert version == 1
    assert_params_equal(got, params(1))


@pytest.mark.parametrize(
    "bad, kwargs, error, match",
    [
        ({}, {}, ValueError, "template: expected a non-empty mapping"),
        ([np.zeros(2)], {}, ValueError, "template: expected a non-empty mapping"),
        ({1: np.zeros(2)}, {}, TypeError, "template: keys must be str"),
        ({"w": np.array([object()])}, {}, TypeError, r"template\['w'\]: expected a numeric array"),
        ({"w": np.zeros(2)}, {"timeout": -1}, ValueError, "timeout: expected a finite number of seconds >= 0"),
        ({"w": np.zeros(2)}, {"timeout": None}, TypeError, "timeout: expected a finite number of seconds >= 0"),
    ],
)
def test_bad_template_is_rejected(bad, kwargs, error, match):
    with pytest.raises(error, match=match):
        ParameterStore(bad, **kwargs)


@pytest.mark.parametrize(
    "out, error, match",
    [
        ({"w": np.empty((3, 2), np.float32)}, ValueError, r"out: expected the keys"),
        (
            {"w": np.empty((2, 3), np.float32), "b": np.empty(4, np.int64)},
            ValueError,
            r"out\['w'\]: expected shape \(3, 2\)",
        ),
        (
            {"w": np.empty((3, 2), np.int32), "b": np.empty(4, np.int64)},
            TypeError,
            r"out\['w'\]: cannot hold dtype float32",
        ),
        ({"w": np.empty((3, 2), np.float32), "b": [0, 0, 0, 0]}, TypeError, r"out\['b'\]: expected a numpy array"),
        ({"w": np.empty((3, 2), np.float32), "b": np.broadcast_to(np.int64(0), (4,))}, ValueError, "read-only"),
    ],
)
def test_bad_out_is_rejected(store, out, error, match):
    with pytest.raises(error, match=match):
        store.read(out)


def test_a_pickled_store_is_a_handle_on_the_same_segment(store):
    handle = pickle.loads(pickle.dumps(store))
    store.publish(params(4))
    got, version = handle.read()
    assert version == 1
    assert_params_equal(got, params(4))


def test_closing_a_handle_leaves_the_segment_to_its_owner(store):
    pickle.loads(pickle.dumps(store)).close()
    assert segment_exists(store.name)
    assert store.read()[1] == 0


def test_closing_the_owner_unlinks_the_segment_and_ends_use():
    store = ParameterStore(template())
    store.close()
    store.close()  # idempotent
    assert not segment_exists(store.name)
    for use in (store.read, lambda: store.publish(params(1)), lambda: store.version, lambda: pickle.dumps(store)):
        with pytest.raises(ValueError, match="the ParameterStore is closed"):
            use()


def test_a_torch_state_dict_round_trips_as_tensors():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    with ParameterStore(model.state_dict()) as store:
        with torch.no_grad():
            model.weight.fill_(0.5)
        store.publish(model.state_dict())
        got, _ = store.read()
        target = torch.nn.Linear(3, 2)
        store.read(dict(target.named_parameters()))  # straight into a model's (grad-requiring) parameters
    assert all(isinstance(value, torch.Tensor) for value in got.values())
    assert torch.equal(got["weight"], torch.full((2, 3), 0.5))
    assert torch.equal(got["bias"], model.bias.detach())
    assert torch.equal(target.weight.detach(), got["weight"])


# ------------------------------------------------------------------ across processes

TORN_TEMPLATE = {"big": np.zeros(1 << 16), "small": np.zeros(7, np.int32)}  # the big copy makes overlaps likely


def publish_versions(store: ParameterStore, stop) -> None:
    """Writer: publish versions 1, 2, ... until ``stop`` is set, every element equal to its version.

    It pauses 0.2 ms between publishes, as a learner trains between them: a reader copying the big
    array can be starved by publishes back to back with no gap (a seqlock's reader retries), which
    is not what this test is about."""
    version = 0
    while not stop.is_set():
        version += 1
        store.publish({key: np.full(array.shape, version, array.dtype) for key, array in TORN_TEMPLATE.items()})
        time.sleep(0.0002)


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_a_reader_never_sees_a_torn_update_while_another_process_publishes(method):
    ctx = multiprocessing.get_context(method)
    with ParameterStore(TORN_TEMPLATE) as store:
        stop = ctx.Event()
        writer = ctx.Process(target=publish_versions, args=(store, stop))
        writer.start()
        seen, torn, last = set(), [], 0
        deadline = time.monotonic() + 30
        # Read until many versions went by mid-publish (or time is up): the reads overlap the writes.
        while len(seen) < 200 and time.monotonic() < deadline:
            got, version = store.read()
            seen.add(version)
            torn += [version for array in got.values() if not (array == version).all()]
            assert version >= last
            last = version
        stop.set()
        writer.join(30)
    assert writer.exitcode == 0
    assert torn == []
    assert len(seen - {0}) > 1, "the reads never overlapped the publishing"


def die_mid_publish(store: ParameterStore) -> None:
    """Writer: die by SIGKILL between the copies of the first and second array of a publish."""
    copy = np.copyto

    def copy_then_die(*args, **kwargs):
        copy(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    np.copyto = copy_then_die
    store.publish(params(9))


def kill_a_writer_mid_publish(store: ParameterStore, method: str) -> None:
    assert run_in_child(method, die_mid_publish, store) == -signal.SIGKILL


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_a_writer_dead_mid_publish_makes_reads_time_out_instead_of_hanging(method):
    with ParameterStore(template(), timeout=0.2) as store:
        kill_a_writer_mid_publish(store, method)
        with pytest.raises(ParameterStoreTimeout, match="did the writer die mid-publish"):
            store.read()


@pytest.mark.timeout(60)
def test_timeout_0_reads_once_and_does_not_wait(monkeypatch):
    with ParameterStore(template(), timeout=0) as store:
        store.publish(params(2))
        assert store.read()[1] == 1
        kill_a_writer_mid_publish(store, "fork")  # a publish that never ends: the counter stays odd
        pauses = []
        monkeypatch.setattr(time, "sleep", pauses.append)  # every retry pauses first
        with pytest.raises(ParameterStoreTimeout, match=r"within 0\.0 s"):
            store.read()
        assert pauses == []  # one try, no retry


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_the_next_publish_after_a_dead_writer_makes_the_store_readable(method):
    with ParameterStore(template(), timeout=0.2) as store:
        kill_a_writer_mid_publish(store, method)
        version = store.publish(params(3))
        got, read_version = store.read()
    assert version == read_version == 1
    assert_params_equal(got, params(3))
