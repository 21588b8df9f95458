"""Sequence buffers: steps stored once, sequences of one episode sampled (R2D2)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, EPISODE_STEP_FIELDS

from mpreplay import (
    MinSize,
    MPPrioritizedSequenceReplayBuffer,
    MPSequenceReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    SequenceReplayBuffer,
    sequence_priority,
)

ENV = EPISODE_STEP_FIELDS


def _step(episode: int, t: int) -> dict:
    """Step t of an episode: its observation says which step of which episode it is."""
    return {"obs": np.array([episode, t], dtype=np.float32)}


def _fill(rb, lengths, first_episode=0, batch=False):
    """Store episodes of the given lengths, each ended by its done flag."""
    for e, n in enumerate(lengths, start=first_episode):
        obs = np.stack([_step(e, t)["obs"] for t in range(n)])
        done = (np.arange(n) == n - 1).astype(np.float32)
        if batch:
            rb.add(obs=obs, done=done)
        else:
            for t in range(n):
                rb.add(obs=obs[t], done=done[t])


def _starts(rb, draws=4000):
    """The (episode, first step, real steps) of every sequence drawn in ``draws`` draws."""
    b = rb.sample(draws)
    return {(int(o[0, 0]), int(o[0, 1]), int(m.sum())) for o, m in zip(b["obs"], b["mask"], strict=True)}


def _expected(lengths, length, period, pad_end=True):
    out = set()
    for e, n in enumerate(lengths):
        starts = list(range(0, max(n - length, -1) + 1, period))
        for s in starts:
            out.add((e, s, length))
        nxt = starts[-1] + period if starts else 0
        covered = bool(starts) and starts[-1] + length >= n
        if pad_end and nxt < n and not covered:
            out.add((e, nxt, n - nxt))
    return out


# -- what a sequence is -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [SequenceReplayBuffer, PrioritizedSequenceReplayBuffer])
def test_sampled_fields_have_a_batch_and_a_step_axis(cls):
    rb = cls(64, {"obs": {"shape": (2,)}, "act": {"dtype": np.int64}, "done": {}}, length=4)
    for t in range(4):
        rb.add(obs=_step(0, t)["obs"], act=t, done=0.0)
    b = rb.sample(3)
    assert b["obs"].shape == (3, 4, 2) and b["act"].shape == (3, 4) and b["act"].dtype == np.int64
    assert b["mask"].shape == (3, 4) and b["mask"].dtype == np.bool_ and b["indexes"].shape == (3,)


def test_a_sequence_holds_consecutive_steps_of_one_episode():
    rb = SequenceReplayBuffer(400, ENV, length=5, period=3)
    _fill(rb, [7, 12, 3, 9, 16])
    b = rb.sample(500)
    for obs, mask in zip(b["obs"], b["mask"], strict=True):
        real = obs[mask]
        assert (real[:, 0] == real[0, 0]).all()
        assert (np.diff(real[:, 1]) == 1).all()


def test_sequences_start_every_period_and_overlap_by_length_minus_period():
    lengths = [7, 12, 3, 9, 16]
    rb = SequenceReplayBuffer(400, ENV, length=5, period=3)
    _fill(rb, lengths)
    assert _starts(rb) == _expected(lengths, 5, 3)


def test_without_pad_end_an_episode_keeps_only_full_sequences():
    lengths = [7, 12, 3, 9]
    rb = SequenceReplayBuffer(400, ENV, length=5, period=3, pad_end=False)
    _fill(rb, lengths)
    assert _starts(rb) == _expected(lengths, 5, 3, pad_end=False)


def test_padding_steps_are_zeros_and_masked():
    rb = SequenceReplayBuffer(64, {"obs": {"shape": (2,)}, "act": {"dtype": np.int64}, "done": {}}, length=6)
    for t in range(2):
        rb.add(obs=_step(3, t + 1)["obs"], act=t + 1, done=float(t == 1))
    b = rb.sample(2)
    assert b["mask"].tolist() == [[True, True, False, False, False, False]] * 2
    assert not b["obs"][:, 2:].any() and not b["act"][:, 2:].any()
    assert b["act"][:, :2].tolist() == [[1, 2]] * 2


def test_a_sequence_is_sampleable_only_once_its_last_step_is_stored():
    rb = SequenceReplayBuffer(64, ENV, length=4)
    for t in range(3):
        rb.add(obs=_step(0, t)["obs"], done=0.0)
    assert rb.stats()["sequences"] == 0
    with pytest.raises(ValueError, match="holds no"):
        rb.sample(1)
    rb.add(obs=_step(0, 3)["obs"], done=0.0)
    assert rb.stats()["sequences"] == 1


def test_on_episode_end_ends_an_episode_without_a_flag():
    rb = SequenceReplayBuffer(64, ENV, length=4)
    for t in range(2):
        rb.add(obs=_step(0, t)["obs"], done=0.0)
    rb.on_episode_end()
    rb.add(obs=_step(1, 0)["obs"], done=1.0)
    assert _starts(rb, 200) == {(0, 0, 2), (1, 0, 1)}


def test_batches_of_steps_store_what_single_steps_store():
    lengths = [7, 12, 3, 9]
    one, many = (SequenceReplayBuffer(400, ENV, length=5, period=2) for _ in range(2))
    _fill(one, lengths)
    _fill(many, lengths, batch=True)
    assert _starts(one) == _starts(many)


def test_a_batch_may_hold_the_end_of_one_episode_and_the_start_of_the_next():
    rb = SequenceReplayBuffer(400, ENV, length=3)
    obs = np.array([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]], dtype=np.float32)
    rb.add(obs=obs, done=np.array([0, 0, 1, 0, 0, 0], dtype=np.float32))
    assert _starts(rb, 200) == {(0, 0, 3), (1, 0, 3)}


def test_episode_writers_keep_interleaved_episodes_apart():
    rb = SequenceReplayBuffer(400, ENV, length=4, lanes=2)
    other = rb.episode_writer()
    for t in range(6):
        rb.add(obs=_step(0, t)["obs"], done=float(t == 5))
        other.add(obs=_step(1, t)["obs"], done=float(t == 5))
    assert _starts(rb, 400) == _expected([6, 6], 4, 4)


# -- overwriting --------------------------------------------------------------------------------------
def test_overwritten_steps_retire_their_sequences_first():
    rb = SequenceReplayBuffer(30, ENV, length=4, period=2)
    _fill(rb, [9] * 20)
    b = rb.sample(2000)
    stored = rb.get_all_transitions()
    kept = {(int(o[0]), int(o[1])) for o in stored["obs"]}
    for obs, mask in zip(b["obs"], b["mask"], strict=True):
        steps = {(int(o[0]), int(o[1])) for o in obs[mask]}
        assert steps <= kept
        assert len({e for e, _ in steps}) == 1


def test_a_lane_shorter_than_a_sequence_is_refused():
    with pytest.raises(ValueError, match="length: a sequence of 40 steps does not fit in a lane of 32 steps"):
        SequenceReplayBuffer(64, ENV, length=40, lanes=2)


# -- priorities ---------------------------------------------------------------------------------------
def test_sequences_are_drawn_in_proportion_to_priority_to_the_alpha(assert_frequencies):
    rb = PrioritizedSequenceReplayBuffer(400, ENV, length=4, alpha=0.7, eps=0.0, seed=3)
    _fill(rb, [4] * 6)
    indexes = np.unique(rb.sample(400)["indexes"])
    assert len(indexes) == 6
    priorities = np.arange(1.0, 7.0)
    rb.update_priorities(indexes, priorities)
    counts = np.zeros(6)
    for _ in range(20):
        drawn = rb.sample(1000, beta=0.4)["indexes"]
        counts += (drawn[:, None] == indexes[None, :]).sum(axis=0)
    assert_frequencies(counts, priorities**0.7)


def test_an_initial_priority_folds_the_steps_priorities_by_eta():
    rb = PrioritizedSequenceReplayBuffer(64, ENV, length=3, alpha=1.0, eps=0.0, eta=0.9)
    rb.add(obs=np.zeros((3, 2), np.float32), done=np.array([0, 0, 1], np.float32), priorities=[1.0, 4.0, 1.0])
    expected = sequence_priority([[1.0, 4.0, 1.0]], eta=0.9)[0]
    assert rb.get_max_priority() == pytest.approx(expected)


def test_a_sequence_without_initial_priorities_gets_the_largest_stored():
    rb = PrioritizedSequenceReplayBuffer(64, ENV, length=2, alpha=1.0, eps=0.0)
    rb.add(obs=np.zeros((2, 2), np.float32), done=np.array([0, 1], np.float32), priorities=[5.0, 5.0])
    rb.add(obs=np.zeros((2, 2), np.float32), done=np.array([0, 1], np.float32))
    total, smallest = rb.leaf_mass()
    assert total == pytest.approx(10.0) and smallest == pytest.approx(5.0)


def test_an_update_of_a_sequence_overwritten_since_it_was_sampled_is_dropped():
    rb = PrioritizedSequenceReplayBuffer(8, ENV, length=4)
    _fill(rb, [4])
    b = rb.sample(1)
    _fill(rb, [4, 4], first_episode=1)
    rb.update_priorities(b["indexes"], [9.0])
    assert rb.stats()["stale_updates_dropped"] == 1 and rb.get_max_priority() < 9.0


def test_an_update_of_a_slot_where_no_sequence_starts_is_dropped():
    rb = PrioritizedSequenceReplayBuffer(64, ENV, length=4)
    _fill(rb, [4])
    start = int(rb.sample(1)["indexes"][0])
    rb.update_priorities([start + 1], [9.0])
    assert rb.stats()["stale_updates_dropped"] == 1 and rb.get_max_priority() == 1.0


# -- compressed frames --------------------------------------------------------------------------------
def _frames_env() -> dict:
    return {
        "obs": {"shape": (3, 3, 4), "dtype": np.uint8},
        "next_obs": {"shape": (3, 3, 4), "dtype": np.uint8},
        "act": {"dtype": np.int64},
        "done": {},
    }


def _atari_episode(rng, n):
    """n steps of stacked frames, each stack the previous one shifted by a new frame."""
    frames = rng.integers(0, 256, size=(n + 1, 3, 3), dtype=np.uint8)

    def stack(t):
        return np.stack([frames[max(0, t - 3 + i)] for i in range(4)], axis=-1)

    obs = np.stack([stack(t) for t in range(n)])
    nxt = np.stack([stack(t + 1) for t in range(n)])
    return obs, nxt


@pytest.mark.parametrize(
    "options", [{"stack_compress": "obs"}, {"next_of": "obs"}, {"stack_compress": "obs", "next_of": "obs"}]
)
def test_compressed_sequences_equal_uncompressed_ones_byte_for_byte(options):
    rng = np.random.default_rng(0)
    plain = SequenceReplayBuffer(600, _frames_env(), length=5, period=2, lanes=1)
    packed = SequenceReplayBuffer(600, _frames_env(), length=5, period=2, lanes=1, **options)
    for e, n in enumerate([7, 3, 11, 5]):
        obs, nxt = _atari_episode(rng, n)
        for rb in (plain, packed):
            for t in range(n):
                rb.add(obs=obs[t], next_obs=nxt[t], act=100 * e + t, done=float(t == n - 1))

    def by_start(rb):
        b = rb.sample(3000)
        return {
            int(a[0]): {k: b[k][j].tobytes() for k in ("obs", "next_obs", "act", "mask")}
            for j, a in enumerate(b["act"])
        }

    assert by_start(packed) == by_start(plain)


# -- input is checked, and copied ---------------------------------------------------------------------
def test_a_bad_step_leaves_the_buffer_unchanged(unchanged):
    rb = SequenceReplayBuffer(64, ENV, length=4)
    rb.add(obs=_step(0, 0)["obs"], done=0.0)
    with unchanged(rb), pytest.raises(ValueError, match="field 'obs'"):
        rb.add(obs=np.zeros((2, 3), np.float32), done=np.zeros(2, np.float32))


def test_a_bad_initial_priority_leaves_the_buffer_unchanged(unchanged):
    rb = PrioritizedSequenceReplayBuffer(64, ENV, length=4)
    with unchanged(rb), pytest.raises(ValueError, match="priorities"):
        rb.add(obs=np.zeros((2, 2), np.float32), done=np.zeros(2, np.float32), priorities=[1.0, -1.0])


def test_arrays_reused_and_mutated_after_add_do_not_change_the_stored_steps():
    rb = SequenceReplayBuffer(
        64, {"obs": {"shape": (3, 3, 4), "dtype": np.uint8}, "done": {}}, length=4, stack_compress="obs"
    )
    stack = np.zeros((3, 3, 4), np.uint8)
    seen = []
    for t in range(4):
        stack[..., :-1] = stack[..., 1:]
        stack[..., -1] = t + 1
        if t == 0:
            stack[...] = 1
        seen.append(stack.copy())
        rb.add(obs=stack, done=float(t == 3))
    stack[...] = 77
    assert np.array_equal(rb.sample(1)["obs"][0], np.stack(seen))


def test_nstep_folding_is_refused():
    with pytest.raises(ValueError, match="nstep: a sequence buffer stores single steps"):
        SequenceReplayBuffer(64, {**ENV, "rew": {}, "next_obs": {"shape": (2,)}}, length=4, nstep={"size": 3})


@pytest.mark.parametrize("cls", [SequenceReplayBuffer, MPSequenceReplayBuffer])
def test_max_times_sampled_is_refused_by_name(cls):
    with pytest.raises(ValueError, match=r"^max_times_sampled: a sequence buffer's items are sequences"):
        cls(64, ENV, length=4, max_times_sampled=1)


def test_a_field_named_episode_step_is_refused():
    with pytest.raises(ValueError, match="'episode_step' is the name"):
        SequenceReplayBuffer(64, {**ENV, "episode_step": {}}, length=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"length": 0}, "length"),
        ({"length": 4, "period": 0}, "period"),
        ({"length": 4, "pad_end": 1}, "pad_end"),
        ({"length": 4, "eta": 1.5}, "eta"),
    ],
)
def test_bad_sequence_settings_are_refused_by_name(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        SequenceReplayBuffer(64, ENV, **kwargs)


# -- snapshots, files, limiter ------------------------------------------------------------------------
def test_a_snapshot_lists_each_step_with_its_index_in_the_episode():
    rb = SequenceReplayBuffer(64, ENV, length=4)
    _fill(rb, [3, 2])
    assert rb.get_all_transitions()["episode_step"].tolist() == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("cls", [SequenceReplayBuffer, PrioritizedSequenceReplayBuffer])
def test_saved_steps_load_into_the_same_sequences(tmp_path, cls):
    lengths = [9, 4, 13]
    rb = cls(400, ENV, length=5, period=2)
    _fill(rb, lengths)
    rb.save_transitions(tmp_path / "steps.npz")
    again = cls(400, ENV, length=5, period=2)
    assert again.load_transitions(tmp_path / "steps.npz") == sum(lengths)
    assert _starts(again) == _starts(rb) == _expected(lengths, 5, 2)


def test_an_episode_whose_first_steps_were_overwritten_loads_its_sequences_where_they_were(tmp_path):
    rb = SequenceReplayBuffer(20, ENV, length=4, period=2)
    _fill(rb, [13, 11])  # the lane of 20 keeps steps 4.. of the first episode
    rb.save_transitions(tmp_path / "steps.npz")
    again = SequenceReplayBuffer(20, ENV, length=4, period=2)
    again.load_transitions(tmp_path / "steps.npz")
    assert _starts(again) == _starts(rb)


def test_saved_priorities_come_back_with_their_sequences(tmp_path):
    rb = PrioritizedSequenceReplayBuffer(64, ENV, length=2, alpha=1.0, eps=0.0)
    rb.add(obs=np.zeros((2, 2), np.float32), done=np.array([0, 1], np.float32), priorities=[3.0, 3.0])
    rb.add(obs=np.zeros((2, 2), np.float32), done=np.array([0, 1], np.float32), priorities=[7.0, 7.0])
    rb.save_transitions(tmp_path / "steps.npz", priorities=True)
    again = PrioritizedSequenceReplayBuffer(64, ENV, length=2, alpha=1.0, eps=0.0)
    again.load_transitions(tmp_path / "steps.npz")
    assert again.leaf_mass() == pytest.approx((10.0, 3.0))


def test_a_min_size_limiter_counts_stored_steps():
    rb = SequenceReplayBuffer(64, ENV, length=2, rate_limiter=MinSize(5))
    _fill(rb, [4])
    with pytest.raises(TimeoutError):
        rb.sample(1, timeout=0)
    rb.add(obs=_step(1, 0)["obs"], done=1.0)
    assert rb.sample(1, timeout=0)["mask"].shape == (1, 2)


# -- many processes -----------------------------------------------------------------------------------
def _actor(rb, actor: int, episodes: int) -> None:
    rng = np.random.default_rng(actor)
    for e in range(episodes):
        n = int(rng.integers(1, 30))
        episode = 1000 * actor + e
        for t in range(n):
            rb.add(obs=np.array([episode, t], np.float32), done=float(t == n - 1))


def _actor_killed_mid_episode(rb, actor: int) -> None:
    _actor(rb, actor, 3)
    for t in range(7):
        rb.add(obs=np.array([1000 * actor + 99, t], np.float32), done=0.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _check_sequences(batch) -> None:
    for obs, mask in zip(batch["obs"], batch["mask"], strict=True):
        real = obs[mask]
        assert len(real) >= 1 and (real[:, 0] == real[0, 0]).all(), real
        assert (np.diff(real[:, 1]) == 1).all(), real
        assert not obs[~mask].any()


@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_writer_processes_killed_mid_episode_never_yield_a_torn_or_mixed_sequence(method):
    ctx = mp.get_context(method)
    rb = MPPrioritizedSequenceReplayBuffer(600, ENV, length=6, period=3, lanes=4)
    try:
        killed = [ctx.Process(target=_actor_killed_mid_episode, args=(rb, a)) for a in (1, 2)]
        for p in killed:
            p.start()
        for p in killed:
            p.join(60)
            assert p.exitcode == -signal.SIGKILL
        writers = [ctx.Process(target=_actor, args=(rb, a, 40)) for a in (3, 4)]
        for p in writers:
            p.start()
        while any(p.is_alive() for p in writers):
            _check_sequences(rb.sample(64))
            time.sleep(0.001)
        for p in writers:
            p.join(60)
            assert p.exitcode == 0
        batch = rb.sample(2000)
        _check_sequences(batch)
        # A killed writer's unfinished episode (7 steps) keeps its one complete sequence.
        unfinished = [(o, m) for o, m in zip(batch["obs"], batch["mask"], strict=True) if o[0, 0] in (1099.0, 2099.0)]
        assert unfinished and all(o[0, 1] == 0 and m.all() for o, m in unfinished)
    finally:
        rb.close()


@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_a_uniform_shared_buffer_samples_sequences_written_by_other_processes(method):
    ctx = mp.get_context(method)
    rb = MPSequenceReplayBuffer(2000, ENV, length=5, period=5, lanes=2)
    try:
        writers = [ctx.Process(target=_actor, args=(rb, a, 20)) for a in (1, 2)]
        for p in writers:
            p.start()
        for p in writers:
            p.join(60)
            assert p.exitcode == 0
        batch = rb.sample(500)
        _check_sequences(batch)
        assert {int(o[0, 0]) // 1000 for o in batch["obs"]} == {1, 2}
    finally:
        rb.close()


def test_sample_fills_the_arrays_given_as_out():
    rb = SequenceReplayBuffer(64, ENV, length=4)
    _fill(rb, [6])
    out = {"obs": np.full((3, 4, 2), -1, np.float32), "mask": np.zeros((3, 4), bool)}
    b = rb.sample(3, out=out)
    assert b["obs"] is out["obs"] and b["mask"] is out["mask"] and out["mask"].any()
    _check_sequences(b)


def test_an_out_array_of_the_wrong_shape_is_refused_by_name():
    rb = SequenceReplayBuffer(64, ENV, length=4)
    _fill(rb, [6])
    with pytest.raises(
        ValueError, match=r"out\['mask'\]: expected a writable C-contiguous bool array of shape \(3, 4\)"
    ):
        rb.sample(3, out={"mask": np.zeros(3, bool)})


def test_a_sharded_client_samples_sequences_from_every_shard():
    from mpreplay.sharded import ShardedReplay, ShardServer

    shards = [PrioritizedSequenceReplayBuffer(200, ENV, length=4, period=2) for _ in range(2)]
    _fill(shards[0], [9, 5])
    _fill(shards[1], [7], first_episode=10)
    client = ShardedReplay([ShardServer(b) for b in shards], prefetch=0, seed=1)
    batch = client.sample(400)
    assert batch["obs"].shape == (400, 4, 2) and batch["mask"].shape == (400, 4)
    _check_sequences(batch)
    assert {int(o[0, 0]) for o in batch["obs"]} == {0, 1, 10}
    client.update_priorities(batch["indexes"], np.full(400, 3.0))
    client.flush()
    assert max(b.get_max_priority() for b in shards) == 3.0


def _launched_actor(ctx) -> None:
    _actor(ctx.buffer, ctx.rank + 1, 10)


def _launched_learner(ctx) -> int:
    while ctx.buffer.stats()["sequences"] < 5:
        time.sleep(0.01)
    batch = ctx.buffer.sample(32)
    _check_sequences(batch)
    return int(batch["mask"].sum())


@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_launched_actors_and_learner_share_a_sequence_buffer(method):
    from mpreplay import launch

    with MPSequenceReplayBuffer(2000, ENV, length=4, lanes=2) as rb:
        result = launch(rb, actors=(_launched_actor, 2), learner=_launched_learner, start_method=method)
        assert result.reason == "learner" and result.value > 0


def test_a_sample_carries_each_steps_index_in_its_episode():
    rb = SequenceReplayBuffer(64, ENV, length=4, period=2)
    _fill(rb, [5])
    b = rb.sample(200)
    for steps, obs, mask in zip(b["episode_step"], b["obs"], b["mask"], strict=True):
        assert steps[mask].tolist() == obs[mask][:, 1].astype(int).tolist()
        assert not steps[~mask].any()
