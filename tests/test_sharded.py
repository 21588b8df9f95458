"""Specification of sharded replay: ShardedReplay over ShardServers, in-process and over Ray.

The math (split, probabilities, weights, stale updates, lost shards) is
specified over the local transport; the tests marked ``ray`` run the same
client over a three-node Ray cluster on loopback (``pytest -m ray``).
"""

from __future__ import annotations

import functools
import pickle
import sys
import types
import warnings

import numpy as np
import pytest
from helpers import run_in_child, segment_exists

from mpreplay import BufferClosed, MPPrioritizedReplayBuffer, PrioritizedReplayBuffer, SharedMemoryError
from mpreplay.sharded import ShardedReplay, ShardLostWarning, ShardServer, ShardUnavailable, split_indexes

ALPHA, EPS = 0.6, 1e-4
# Every field encodes the transition's id, so a row's identity is visible in any field.
ENV = {"id": {"dtype": np.int64}, "obs": {"shape": (2,), "dtype": np.float32}}
RAY = pytest.mark.ray


def _rows(ids) -> dict[str, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "obs": np.stack([ids, -ids], axis=1).astype(np.float32)}


def _fill(buffer: PrioritizedReplayBuffer, ids, priorities) -> PrioritizedReplayBuffer:
    buffer.add(**_rows(ids), priorities=priorities)
    return buffer


def _leaf(priorities) -> np.ndarray:
    return (np.asarray(priorities, dtype=np.float64) + EPS) ** ALPHA


# Three shards of different sizes and priority ranges; transition i has priority PRIORITY[i].
SIZES = (10, 25, 40)
IDS = np.split(np.arange(sum(SIZES)), np.cumsum(SIZES)[:-1])
PRIORITY = np.concatenate(
    [
        np.linspace(0.05, 1.0, SIZES[0]),  # holds the global minimum
        np.linspace(0.5, 3.0, SIZES[1]),
        np.linspace(1.0, 8.0, SIZES[2]),
    ]
)


def _buffers(cls=PrioritizedReplayBuffer, capacity: int = 64) -> list[PrioritizedReplayBuffer]:
    return [_fill(cls(capacity, ENV, alpha=ALPHA, eps=EPS), ids, PRIORITY[ids]) for ids in IDS]


def _client(buffers, **options) -> ShardedReplay:
    return ShardedReplay([ShardServer(b) for b in buffers], seed=1, **options)


def _draw_ids(client: ShardedReplay, batches: int, batch_size: int = 32) -> np.ndarray:
    return np.concatenate([client.sample(batch_size)["id"] for _ in range(batches)])


def _max_priority(server_or_buffer) -> float:
    return server_or_buffer.get_max_priority()


# -- the batch ------------------------------------------------------------------------------------
def test_batch_has_the_keys_dtypes_and_shapes_of_a_local_sample():
    local = _buffers()[2]
    batch = _client(_buffers()).sample(16)
    expected = local.sample(16)
    assert batch.keys() == expected.keys()
    for key, value in expected.items():
        assert batch[key].dtype == value.dtype and batch[key].shape == value.shape, key


def test_rows_are_whole_transitions_and_indexes_name_their_shard_and_slot():
    buffers = _buffers()
    client = _client(buffers)
    batch = client.sample(64)
    assert (batch["obs"] == np.stack([batch["id"], -batch["id"]], axis=1)).all()
    ids = client.shard_ids()
    for shard, slot, row_id in zip(*split_indexes(batch["indexes"])[:2], batch["id"], strict=True):
        buffer = buffers[ids.index(shard)]
        assert buffer.get_all_transitions()["id"][slot] == row_id


def test_batch_size_may_change_between_calls():
    client = _client(_buffers())
    assert len(client.sample(8)["id"]) == 8
    assert len(client.sample(5)["id"]) == 5


# -- sampling probabilities ---------------------------------------------------------------------------
def test_shards_get_draws_in_proportion_to_their_total_priority(assert_frequencies):
    client = _client(_buffers())
    shards = split_indexes(np.concatenate([client.sample(32)["indexes"] for _ in range(300)]))[0]
    totals = [_leaf(PRIORITY[ids]).sum() for ids in IDS]
    assert_frequencies(np.bincount(shards, minlength=3), totals)


def test_each_transition_is_drawn_with_its_priority_over_the_sum_of_all_shards(assert_frequencies):
    client = _client(_buffers())
    ids = _draw_ids(client, 600)
    assert_frequencies(np.bincount(ids, minlength=len(PRIORITY)), _leaf(PRIORITY))


def test_every_batch_is_split_by_shares_not_only_on_average():
    # Systematic allocation: a shard's count is the floor or ceiling of its share of the batch.
    client = _client(_buffers())
    totals = np.array([_leaf(PRIORITY[ids]).sum() for ids in IDS])
    expected = 32 * totals / totals.sum()
    for _ in range(50):
        counts = np.bincount(split_indexes(client.sample(32)["indexes"])[0], minlength=3)
        assert (np.abs(counts - expected) < 1).all(), (counts, expected)


def test_empty_shards_get_no_draws():
    buffers = _buffers()
    empty = PrioritizedReplayBuffer(64, ENV, alpha=ALPHA, eps=EPS)
    client = _client([*buffers, empty])
    shards = split_indexes(np.concatenate([client.sample(32)["indexes"] for _ in range(20)]))[0]
    assert 3 not in shards


def test_sampling_shards_that_hold_nothing_raises():
    client = _client([PrioritizedReplayBuffer(8, ENV) for _ in range(2)])
    with pytest.raises(ValueError, match="no transition"):
        client.sample(4)


# -- importance weights -----------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_weights_equal_those_of_one_buffer_holding_every_shard(beta):
    union = PrioritizedReplayBuffer(128, ENV, alpha=ALPHA, eps=EPS)
    _fill(union, np.arange(len(PRIORITY)), PRIORITY)
    # What one buffer gives, and what the formula gives: (v_i / min_j v_j) ** -beta.
    expected = (_leaf(PRIORITY) / _leaf(PRIORITY).min()) ** -beta
    one = union.sample(256, beta)
    np.testing.assert_allclose(one["weights"], expected[one["id"]], rtol=1e-12)
    batch = _client(_buffers()).sample(256, beta)
    np.testing.assert_allclose(batch["weights"], expected[batch["id"]], rtol=1e-12)


def test_weights_use_the_global_minimum_even_when_its_shard_is_not_drawn():
    # A shard with one tiny priority is almost never drawn, yet it sets every weight's scale.
    tiny = _fill(PrioritizedReplayBuffer(8, ENV, alpha=ALPHA, eps=EPS), [100], [1e-3])
    client = _client([*_buffers(), tiny])
    batch = client.sample(4, 1.0)
    assert 3 not in split_indexes(batch["indexes"])[0]
    np.testing.assert_allclose(batch["weights"], _leaf(1e-3) / _leaf(PRIORITY[batch["id"]]), rtol=1e-12)


# -- priority updates -------------------------------------------------------------------------------
def test_updated_priorities_reach_the_sampled_transitions():
    client = _client(_buffers(), prefetch=0, batches_per_call=1)
    # Every transition down to 1e-3, except one up to 1e3: it should then fill the batches.
    for _ in range(40):
        batch = client.sample(32)
        client.update_priorities(batch["indexes"], np.where(batch["id"] == 7, 1e3, 1e-3))
    ids = _draw_ids(client, 4)
    assert np.mean(ids == 7) > 0.9


def test_updates_ride_with_the_next_sample_call_or_go_alone_when_they_pile_up():
    buffers = _buffers()
    client = _client(buffers, prefetch=0, batches_per_call=1)
    batch = client.sample(32)
    client.update_priorities(batch["indexes"], np.full(32, 1e3))
    assert max(_max_priority(b) for b in buffers) < 1e3  # not sent yet
    client.sample(32)
    assert max(_max_priority(b) for b in buffers) == 1e3  # applied before that draw
    # Without a sample call to carry them, 2 * batches_per_call updates to a shard go on their own.
    client.update_priorities(batch["indexes"], np.full(32, 1e4))
    assert max(_max_priority(b) for b in buffers) == 1e3
    client.update_priorities(batch["indexes"], np.full(32, 1e5))
    assert max(_max_priority(b) for b in buffers) == 1e5


def test_flush_applies_every_update_not_sent_yet():
    buffers = _buffers()
    client = _client(buffers)
    batch = client.sample(32)
    client.update_priorities(batch["indexes"], np.full(32, 1e3))
    client.flush()
    assert max(_max_priority(b) for b in buffers) == 1e3


def test_update_for_a_slot_overwritten_since_it_was_sampled_is_dropped():
    buffers = _buffers()
    client = _client(buffers)
    batch = client.sample(32)
    for buffer in buffers:  # the ring wraps: every sampled slot now holds a new transition
        _fill(buffer, np.arange(1000, 1064), np.ones(64))
    client.update_priorities(batch["indexes"], np.full(32, 1e3))
    client.flush()
    assert all(_max_priority(b) == 1.0 for b in buffers)
    assert client.stats()["stale_updates_dropped"] == 32


def test_update_is_dropped_even_when_the_new_occupant_was_sampled_since():
    # Capacity 1: every draw is slot 0.  The shard server sampled the new
    # occupant too, so only the generation in the index tells the two apart.
    buffer = _fill(PrioritizedReplayBuffer(1, ENV, alpha=ALPHA, eps=EPS), [1], [1.0])
    client = _client([buffer], prefetch=0, batches_per_call=1)
    old = client.sample(1)
    _fill(buffer, [2], [1.0])
    new = client.sample(1)
    assert new["id"][0] == 2 and split_indexes(old["indexes"])[1] == split_indexes(new["indexes"])[1]
    client.update_priorities(old["indexes"], [1e3])
    client.flush()
    assert _max_priority(buffer) == 1.0
    client.update_priorities(new["indexes"], [5.0])
    client.flush()
    assert _max_priority(buffer) == 5.0


@pytest.mark.parametrize(
    "indexes, priorities, error, match",
    [
        ([[1, 2]], [1.0, 2.0], ValueError, "indexes: expected a 1-D"),
        ([0.5], [1.0], ValueError, "indexes: expected integers"),
        ([0, 1], [1.0], ValueError, "priorities: expected 2 values"),
        ([0], [-1.0], ValueError, "priorities: expected finite"),
        ([0], [np.nan], ValueError, "priorities: expected finite"),
        ([-1], [1.0], ValueError, "indexes: expected indexes this client"),
        ([99 << 52], [1.0], ValueError, "indexes: expected indexes this client"),
    ],
)
def test_bad_updates_raise_and_change_nothing(indexes, priorities, error, match):
    buffers = _buffers()
    client = _client(buffers)
    with pytest.raises(error, match=match):
        client.update_priorities(np.array(indexes), priorities)
    assert client.stats()["stale_updates_dropped"] == 0
    assert [_max_priority(b) for b in buffers] == [PRIORITY[ids].max() for ids in IDS]


def test_a_priority_above_what_its_shard_accepts_raises_at_the_call_and_sampling_goes_on():
    buffers = _buffers()
    client = _client(buffers, prefetch=0, batches_per_call=1)
    batch = client.sample(8)
    with pytest.raises(ValueError, match="priorities: expected finite values in"):
        client.update_priorities(batch["indexes"], np.full(8, 1e301))
    assert len(client.sample(8)["indexes"]) == 8
    assert client.stats()["stale_updates_dropped"] == 0
    assert [_max_priority(b) for b in buffers] == [PRIORITY[ids].max() for ids in IDS]


def test_each_update_is_held_to_the_largest_priority_of_its_own_shard():
    # With alpha = 2 the largest priority accepted falls with the capacity.
    small, large = (
        _fill(PrioritizedReplayBuffer(capacity, ENV, alpha=2.0, eps=EPS), [0], [1.0]) for capacity in (2, 4096)
    )
    assert small.max_priority > large.max_priority
    client = ShardedReplay([ShardServer(small), ShardServer(large)], prefetch=0, batches_per_call=1, seed=1)
    between = (small.max_priority + large.max_priority) / 2
    drawn = client.sample(8)["indexes"]  # the two shards weigh the same: 4 rows each
    indexes = {int(sid): index for sid, index in zip(split_indexes(drawn)[0], drawn, strict=True)}
    with pytest.raises(ValueError, match="priorities: expected finite values in"):
        client.update_priorities([indexes[1]], [between])
    client.update_priorities([indexes[0]], [between])
    client.flush()
    assert _max_priority(small) == between


def test_a_shard_describes_the_largest_priority_its_buffer_accepts():
    buffer = _buffers()[0]
    assert ShardServer(buffer).describe()["max_priority"] == buffer.max_priority


def test_timeout_0_samples_and_updates_through_local_shards():
    buffers = _buffers()
    client = _client(buffers, timeout=0)
    batch = client.sample(16)
    client.update_priorities(batch["indexes"], np.full(16, 0.5))
    client.flush()
    assert client.stats()["shards"] == len(buffers)


def test_timeout_0_asks_ray_for_a_reply_without_waiting(monkeypatch):
    from mpreplay.sharded.transport import RayLink

    asked = []
    ray = types.ModuleType("ray")
    ray.get = lambda pending, timeout: asked.append(timeout) or "reply"
    exceptions = types.ModuleType("ray.exceptions")
    exceptions.GetTimeoutError = exceptions.RayActorError = type("RayError", (Exception,), {})
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    link = RayLink.__new__(RayLink)  # the handle is not needed to wait
    assert link.wait("ref", 0.0) == "reply"
    assert asked == [0.0]


# -- shards that come and go ------------------------------------------------------------------------
def test_a_lost_shard_is_dropped_with_a_warning_and_sampling_goes_on():
    buffers = _buffers()
    # Batches fetched before the loss would still be handed out: fetch none ahead.
    client = _client(buffers, prefetch=0, batches_per_call=1)
    client.sample(32)
    buffers[2].close()
    with pytest.warns(ShardLostWarning, match="shard 2 is gone"):
        ids = _draw_ids(client, 20)
    assert client.shard_ids() == [0, 1]
    assert not np.isin(ids, IDS[2]).any()


def test_weights_after_a_shard_is_lost_are_those_of_the_shards_left():
    buffers = _buffers()
    client = _client(buffers)
    buffers[0].close()  # it held the global minimum
    with pytest.warns(ShardLostWarning):
        batch = client.sample(64, 1.0)
    left = np.concatenate(IDS[1:])
    np.testing.assert_allclose(batch["weights"], _leaf(PRIORITY[left]).min() / _leaf(PRIORITY[batch["id"]]), rtol=1e-12)


def test_updates_to_a_lost_shard_are_dropped_and_counted():
    buffers = _buffers()
    client = _client(buffers, prefetch=0, batches_per_call=1)
    batch = client.sample(32)
    lost = split_indexes(batch["indexes"])[0] == 2
    buffers[2].close()
    with pytest.warns(ShardLostWarning):
        client.sample(32)
    client.update_priorities(batch["indexes"], np.ones(32))
    assert client.stats()["updates_to_lost_shards"] == np.count_nonzero(lost)


def test_a_returning_shard_gets_a_new_id_and_old_indexes_never_reach_it():
    buffers = _buffers()
    client = _client(buffers, prefetch=0, batches_per_call=1)
    before = client.sample(32)
    buffers[2].close()
    with pytest.warns(ShardLostWarning):
        client.sample(32)
    back = _fill(PrioritizedReplayBuffer(64, ENV, alpha=ALPHA, eps=EPS), IDS[2], PRIORITY[IDS[2]])
    assert client.add_shard(ShardServer(back)) == 3
    assert 3 in split_indexes(np.concatenate([client.sample(32)["indexes"] for _ in range(5)]))[0]
    client.update_priorities(before["indexes"], np.full(32, 1e3))
    client.flush()
    assert _max_priority(back) == PRIORITY[IDS[2]].max()


def test_adding_a_server_twice_keeps_its_id():
    server = ShardServer(_buffers()[0])
    client = ShardedReplay([server])
    assert client.add_shard(server) == 0 and client.shard_ids() == [0]


def test_adding_a_server_that_does_not_answer_raises():
    buffer = _buffers()[0]
    server = ShardServer(buffer)
    buffer.close()
    with pytest.raises(ShardUnavailable, match="closed"):
        ShardedReplay([server])


def test_sampling_with_every_shard_lost_raises():
    buffers = _buffers()
    client = _client(buffers)
    for b in buffers:
        b.close()
    with pytest.warns(ShardLostWarning), pytest.raises(RuntimeError, match="no shard left"):
        client.sample(4)


# -- configuration and the rest of the API ------------------------------------------------------------
def test_a_shard_with_other_fields_or_exponents_is_refused():
    client = _client(_buffers())
    with pytest.raises(ValueError, match="shard: its buffer has"):
        client.add_shard(ShardServer(PrioritizedReplayBuffer(8, {"x": {}}, alpha=ALPHA, eps=EPS)))
    with pytest.raises(ValueError, match="shard: its buffer has"):
        client.add_shard(ShardServer(PrioritizedReplayBuffer(8, ENV, alpha=0.7, eps=EPS)))


@pytest.mark.parametrize(
    "shard, error, match",
    [
        (object(), TypeError, "shard: expected a ShardServer"),
    ],
)
def test_add_shard_refuses_what_is_not_a_server(shard, error, match):
    with pytest.raises(error, match=match):
        ShardedReplay([shard])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"prefetch": -1}, "prefetch: expected an integer >= 0"),
        ({"batches_per_call": 0}, "batches_per_call: expected an integer >= 1"),
        ({"max_updates_in_flight": 0}, "max_updates_in_flight: expected an integer >= 1"),
        ({"timeout": -1.0}, "timeout: expected None \\(no limit\\) or a finite number of seconds >= 0"),
        ({"timeout": float("nan")}, "timeout: expected None \\(no limit\\) or a finite number of seconds >= 0"),
        ({"rediscover_every": -1.0}, "rediscover_every: expected a finite number of seconds >= 0"),
    ],
)
def test_bad_options_raise(options, match):
    with pytest.raises(ValueError, match=match):
        ShardedReplay(**options)


@pytest.mark.parametrize(
    "batch_size, beta, error, match",
    [
        (0, 0.4, ValueError, "batch_size: expected an integer >= 1"),
        (2.0, 0.4, ValueError, "batch_size: expected an integer >= 1"),
        (4, -0.1, ValueError, r"beta: expected a finite number in \[0, 1\], got -0.1"),
        (4, 1.5, ValueError, r"beta: expected a finite number in \[0, 1\], got 1.5"),
        (4, "x", TypeError, "beta: expected a number"),
    ],
)
def test_bad_sample_arguments_raise(batch_size, beta, error, match):
    with pytest.raises(error, match=match):
        _client(_buffers()).sample(batch_size, beta)


def test_a_server_refuses_what_is_not_a_replay_table():
    with pytest.raises(TypeError, match="buffer: expected a replay table"):
        ShardServer(lambda: "not a buffer")


@pytest.mark.parametrize("selector", ["max_heap", "min_heap"])
def test_a_server_refuses_a_buffer_whose_selector_does_not_draw_in_proportion_to_priority(selector):
    refusal = rf"buffer: selector '{selector}' .* expected a selector that does: 'prioritized'"
    with PrioritizedReplayBuffer(8, ENV, selector=selector) as buffer, pytest.raises(ValueError, match=refusal):
        ShardServer(buffer)


def test_a_server_that_refuses_the_buffer_its_factory_made_releases_it():
    made = []

    def factory() -> MPPrioritizedReplayBuffer:
        made.append(MPPrioritizedReplayBuffer(8, ENV, selector="max_heap"))
        return made[-1]

    with pytest.raises(ValueError, match="selector 'max_heap'"):
        ShardServer(factory)
    (buffer,) = made  # still referenced: only close() unlinks its segment
    with pytest.raises(BufferClosed):
        buffer.sample(1)
    assert not segment_exists(buffer.name)


def test_a_server_made_with_a_factory_owns_and_releases_its_buffer():
    server = ShardServer(functools.partial(MPPrioritizedReplayBuffer, 8, ENV))
    handle = pickle.dumps(server.buffer())
    server.close()
    with pytest.raises(SharedMemoryError, match="no longer exists"):
        pickle.loads(handle)


def test_sizes_and_counters_add_up_over_shards():
    buffers = _buffers()
    client = _client(buffers)
    client.sample(32)
    stats = client.stats()
    assert client.get_stored_size() == stats["stored"] == sum(SIZES)
    assert client.get_buffer_size() == 3 * 64
    assert stats["shards"] == 3 and sorted(stats["per_shard"]) == [0, 1, 2]
    assert stats["samples"] == sum(s["samples"] for s in stats["per_shard"].values())
    assert client.get_env_dict() == buffers[0].get_env_dict()


class _SavingBuffer(PrioritizedReplayBuffer):
    saved: list

    def save_transitions(self, file, **options):
        self.saved = [file, options]
        return file


def test_each_shard_saves_its_own_file():
    buffers = [_fill(_SavingBuffer(8, ENV, alpha=ALPHA, eps=EPS), [i], [1.0]) for i in range(2)]
    client = _client(buffers)
    assert client.save_transitions("/data/shard-{shard}.npz", compress=False) == {
        0: "/data/shard-0.npz",
        1: "/data/shard-1.npz",
    }
    assert buffers[1].saved == ["/data/shard-1.npz", {"compress": False}]


def test_saving_several_shards_to_one_path_is_refused():
    client = _client([_fill(_SavingBuffer(8, ENV), [i], [1.0]) for i in range(2)])
    with pytest.raises(ValueError, match=r"path: expected a '\{shard\}' placeholder"):
        client.save_transitions("/data/all.npz")


# -- over Ray ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """Three Ray nodes on loopback, shared by the module's Ray tests."""
    pytest.importorskip("ray")
    from mpreplay.testing import LoopbackRayCluster

    with LoopbackRayCluster(3) as c:
        yield c


@pytest.fixture
def served(cluster, request):
    """One shared buffer per node, made here (this process owns the segments), each served
    by a shard server on its node; yields ``(buffers, {node_id: server})``."""
    import ray

    from mpreplay.sharded import start_shard_servers

    buffers = _buffers(MPPrioritizedReplayBuffer)
    prefix = f"{request.node.name}-"
    servers = start_shard_servers(dict(zip(cluster.node_ids, buffers, strict=False)), name_prefix=prefix, num_cpus=0)
    yield buffers, servers
    for handle in servers.values():
        ray.kill(handle)
    for b in buffers:
        b.close()


@RAY
@pytest.mark.timeout(120)
def test_each_node_serves_its_shard_and_the_split_follows_priority(served, assert_frequencies):
    import ray

    _, servers = served
    assert [ray.get(h.node_id.remote()) for h in servers.values()] == list(servers)
    client = ShardedReplay(servers.values(), seed=2)
    shards = split_indexes(np.concatenate([client.sample(32)["indexes"] for _ in range(200)]))[0]
    assert_frequencies(np.bincount(shards, minlength=3), [_leaf(PRIORITY[ids]).sum() for ids in IDS])


@RAY
@pytest.mark.timeout(120)
def test_weights_over_ray_equal_those_of_one_buffer_holding_every_shard(served):
    client = ShardedReplay(served[1].values(), seed=3)
    batch = client.sample(256, 0.4)
    np.testing.assert_allclose(
        batch["weights"], (_leaf(PRIORITY[batch["id"]]) / _leaf(PRIORITY).min()) ** -0.4, rtol=1e-12
    )
    assert batch["obs"].flags.writeable


@RAY
@pytest.mark.timeout(120)
def test_stale_updates_are_dropped_over_ray(served):
    buffers, servers = served
    client = ShardedReplay(servers.values(), seed=4)
    batch = client.sample(32)
    for buffer in buffers:
        _fill(buffer, np.arange(1000, 1064), np.ones(64))
    client.update_priorities(batch["indexes"], np.full(32, 1e3))
    client.flush()
    assert client.stats()["stale_updates_dropped"] == 32
    assert all(_max_priority(b) == 1.0 for b in buffers)


@RAY
@pytest.mark.timeout(120)
def test_a_shard_that_does_not_answer_in_time_is_dropped(served):
    buffers, servers = served
    client = ShardedReplay(servers.values(), timeout=2.0, prefetch=0, batches_per_call=1, seed=7)
    # Holding the lock of one shard's buffer: its server's next draw waits for it.
    with buffers[2].inspection().holding_lock(), pytest.warns(ShardLostWarning, match=r"no answer within 2\.0 s"):
        ids = client.sample(32)["id"]
    assert len(client.shard_ids()) == 2 and not np.isin(ids, IDS[2]).any()


def _write_ids(buffer, ids) -> None:
    buffer.add(**_rows(ids), priorities=np.full(len(ids), 50.0))


@RAY
@pytest.mark.timeout(120)
# Forking a process that runs Ray can deadlock: writers start by spawn or forkserver.
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_writer_processes_write_through_the_handle_of_their_nodes_server(served, method):
    import ray

    _, servers = served
    handle = ray.get(next(iter(servers.values())).buffer.remote())
    assert run_in_child(method, _write_ids, handle, np.arange(500, 510), timeout=60) == 0
    client = ShardedReplay(servers.values(), seed=5)
    ids = _draw_ids(client, 10)
    assert np.isin(np.arange(500, 510), ids).all()


@RAY
@pytest.mark.timeout(120)
def test_ray_actors_write_to_their_nodes_buffer(served, request):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mpreplay.sharded import node_buffer

    buffers, servers = served
    node = list(servers)[1]

    @ray.remote(num_cpus=0)
    def act(prefix):  # self-contained: Ray workers cannot import this test module
        ids = np.arange(700, 704)
        node_buffer(prefix).add(id=ids, obs=np.stack([ids, -ids], axis=1), priorities=np.ones(4))

    ray.get(
        act.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            f"{request.node.name}-"
        )
    )
    assert np.isin(np.arange(700, 704), buffers[1].get_all_transitions()["id"]).all()


@RAY
@pytest.mark.timeout(180)
def test_learner_goes_on_when_a_shard_node_is_removed_and_a_new_one_joins_by_name(cluster):
    import ray

    from mpreplay.sharded import start_shard_servers

    buffers = _buffers(MPPrioritizedReplayBuffer)
    extra = cluster.add_node()
    nodes = [*cluster.node_ids[:2], extra]
    prefix = "rejoin-"
    servers = start_shard_servers(dict(zip(nodes, buffers, strict=False)), name_prefix=prefix, num_cpus=0)
    client = ShardedReplay(discover=prefix, rediscover_every=0.0, seed=6)
    try:
        assert len(client.shard_ids()) == 3
        client.sample(32)
        cluster.remove_node(extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2000):  # Ray notices the lost node within seconds
                client.sample(32)
                if len(client.shard_ids()) == 2:
                    break
        assert len(client.shard_ids()) == 2
        assert any(issubclass(w.category, ShardLostWarning) for w in caught)
        assert not np.isin(_draw_ids(client, 10), IDS[2]).any()
        # A replacement node starts a server under the same prefix: the client finds it.
        replacement = cluster.add_node()
        servers.update(start_shard_servers({replacement: buffers[2]}, name_prefix=prefix, num_cpus=0))
        ids = _draw_ids(client, 10)
        assert len(client.shard_ids()) == 3 and np.isin(ids, IDS[2]).any()
    finally:
        for handle in servers.values():
            ray.kill(handle)
        for b in buffers:
            b.close()
