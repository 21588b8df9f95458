"""Memory compression (next_of, stack_compress): samples are bit-identical to an
uncompressed buffer's, locally and with several writer processes."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest
from helpers import EACH_START_METHOD

from mpreplay import MPPrioritizedReplayBuffer, NstepBuffer, PrioritizedReplayBuffer, ReplayBuffer
from mpreplay._ext.frames import wide_interleave

FRAME = (3, 2)
STACK = 3
OPTIONS = {
    "next_of": dict(next_of="obs"),
    "stack": dict(stack_compress="obs"),
    "both": dict(next_of="obs", stack_compress="obs"),
}


def _frame(episode: int, t: int) -> np.ndarray:
    return np.random.default_rng([episode, t]).integers(0, 256, FRAME, dtype=np.uint8)


def _observation(episode: int, t: int) -> np.ndarray:
    """The stacked observation at step t: the last STACK frames, the first repeated at the start."""
    return np.stack([_frame(episode, max(0, t - STACK + 1 + i)) for i in range(STACK)], axis=-1)


def _env(truncation: bool) -> dict:
    env = {
        "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
        "next_obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
        "id": {"dtype": np.int64},
        "rew": {},
        "done": {},
    }
    if truncation:
        env["truncated"] = {}
    return env


def _episode(episode: int, length: int, ending: str) -> list[dict]:
    """Steps of one episode; ``ending``: 'done', 'truncated' or 'call' (on_episode_end)."""
    steps = []
    for t in range(length):
        last = t == length - 1
        step = dict(
            obs=_observation(episode, t),
            next_obs=_observation(episode, t + 1),
            id=episode * 1000 + t,
            rew=float(t),
            done=float(last and ending == "done"),
        )
        if ending == "truncated" or "truncated" in steps[0:0]:
            step["truncated"] = float(last and ending == "truncated")
        steps.append(step)
    return steps


def _play(buffers, episodes, rng, truncation: bool, batch: bool = False) -> None:
    for e in range(episodes):
        ending = rng.choice(["done", "truncated", "call"] if truncation else ["done", "call"])
        steps = _episode(e, int(rng.integers(1, 9)), ending)
        if truncation:
            for s in steps:
                s.setdefault("truncated", 0.0)
        for b in buffers:
            if batch:
                b.add(**{k: np.stack([np.asarray(s[k]) for s in steps]) for k in steps[0]})
            else:
                for s in steps:
                    b.add(**s)
            if ending == "call":
                b.on_episode_end()


def _by_id(rows: dict) -> dict[int, dict]:
    return {int(i): {k: v[j] for k, v in rows.items()} for j, i in enumerate(rows["id"])}


def _assert_rows_match(got: dict, reference: dict[int, dict]) -> None:
    for j, i in enumerate(got["id"]):
        want = reference[int(i)]
        for name, value in want.items():
            assert np.array_equal(got[name][j], value), f"field {name} of transition {i}"


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("truncation", [False, True], ids=["done", "done+truncated"])
@pytest.mark.parametrize("batch", [False, True], ids=["steps", "episodes"])
def test_compressed_samples_equal_the_uncompressed_transitions(option, truncation, batch):
    env = _env(truncation)
    compressed = PrioritizedReplayBuffer(64, env, seed=1, **OPTIONS[option])
    plain = PrioritizedReplayBuffer(64, env, seed=1)
    _play([compressed, plain], 60, np.random.default_rng(7), truncation, batch)  # wraps several times
    reference = _by_id(plain.get_all_transitions())
    stored = compressed.get_all_transitions()
    assert set(stored) == set(env)
    # Everything kept is exact, and it is the newest transitions.
    _assert_rows_match(stored, reference)
    assert len(stored["id"]) >= 40
    assert set(stored["id"]) <= set(reference)
    _assert_rows_match(compressed.sample(500), reference)


@pytest.fixture(params=[True, False], ids=["32-byte-steps", "16-byte-steps"])
def interleave_width(request):
    """Rebuild stacks 32 bytes of a frame at a time (AVX2), or 16 (SSE2), for the test."""
    before = wide_interleave(request.param)
    try:
        if wide_interleave() != request.param:
            pytest.skip("this CPU has no AVX2")
        yield
    finally:
        wide_interleave(before)


@pytest.mark.parametrize("frame", [(5, 3), (7, 11), (84, 84)], ids=["one-byte-steps", "32+1", "32+16"])
@pytest.mark.parametrize("option", ["stack", "both"])
def test_four_uint8_frame_stacks_sampled_with_their_next_ones_are_exact(frame, option, interleave_width):
    # A stack of four uint8 frames and the next one are rebuilt together 32 (or 16) and 1 bytes of
    # a frame at a time, the widest first: frames of 15, 77 and 7056 bytes take each in turn.
    env = {
        "obs": {"shape": frame + (4,), "dtype": np.uint8},
        "next_obs": {"shape": frame + (4,), "dtype": np.uint8},
        "id": {"dtype": np.int64},
        "done": {},
    }
    compressed = ReplayBuffer(40, env, seed=2, **OPTIONS[option])
    plain = ReplayBuffer(40, env, seed=2)
    rng = np.random.default_rng(5)
    for e in range(12):
        new = [rng.integers(0, 256, frame, dtype=np.uint8) for _ in range(9)]
        frames = new[:1] * 3 + new  # an episode's first stack is its first frame four times
        for t in range(8):
            step = dict(
                obs=np.stack(frames[t : t + 4], axis=-1),
                next_obs=np.stack(frames[t + 1 : t + 5], axis=-1),
                id=e * 100 + t,
                done=float(t == 7),
            )
            compressed.add(**step)
            plain.add(**step)
    _assert_rows_match(compressed.sample(200), _by_id(plain.get_all_transitions()))


@pytest.mark.parametrize("option", ["next_of", "both"])
def test_nstep_rows_rebuild_their_next_observation_n_steps_ahead(option):
    env = _env(False)
    step_env = dict(env)
    compressed = ReplayBuffer(96, step_env, nstep={"size": 3, "gamma": 0.9}, **OPTIONS[option])
    folder = NstepBuffer(step_env, 3, 0.9)
    plain = ReplayBuffer(96, {**step_env, "discount": {}})
    rng = np.random.default_rng(3)
    for e in range(40):
        ending = rng.choice(["done", "call"])
        for s in _episode(e, int(rng.integers(1, 9)), ending):
            compressed.add(**s)
            plain.add(**folder.add(**s))
        if ending == "call":
            compressed.on_episode_end()
            plain.add(**folder.on_episode_end())
    reference = _by_id(plain.get_all_transitions())
    stored = compressed.get_all_transitions()
    _assert_rows_match(stored, reference)
    assert len(stored["id"]) >= 50
    _assert_rows_match(compressed.sample(300), reference)


def test_actor_side_nstep_output_fed_to_a_compressed_buffer_is_exact():
    env = _env(False)
    folder = NstepBuffer(env, 4, 0.5)
    compressed = ReplayBuffer(128, {**env, "discount": {}}, next_of="obs", stack_compress="obs")
    plain = ReplayBuffer(128, {**env, "discount": {}})
    for e in range(30):
        for s in _episode(e, 1 + e % 9, "done"):
            out = folder.add(**s)
            compressed.add(**out)
            plain.add(**out)
    compressed.on_episode_end()
    _assert_rows_match(compressed.get_all_transitions(), _by_id(plain.get_all_transitions()))


def test_a_transition_waits_until_its_next_observation_is_stored():
    buffer = ReplayBuffer(64, _env(False), next_of="obs")
    steps = _episode(0, 3, "call")
    buffer.add(**steps[0])
    assert buffer.get_stored_size() == 0
    buffer.add(**steps[1])
    assert buffer.get_stored_size() == 1
    buffer.add(**steps[2])
    buffer.on_episode_end()
    assert buffer.get_stored_size() == 3


@pytest.mark.parametrize("option", ["next_of", "both"])
def test_the_priority_of_a_one_step_add_applies_once_its_next_observation_is_stored(option):
    buffer = PrioritizedReplayBuffer(64, _env(False), **OPTIONS[option])
    steps = _episode(0, 3, "done")
    buffer.add(**steps[0], priorities=5.0)
    assert buffer.get_stored_size() == 0
    buffer.add(**steps[1], priorities=2.0)
    assert (buffer.get_stored_size(), buffer.get_max_priority()) == (1, 5.0)
    buffer.add(**steps[2], priorities=3.0)  # done: its next observation takes a slot of its own
    total, _ = buffer.leaf_mass()
    assert buffer.get_stored_size() == 3
    assert total == pytest.approx(sum((p + buffer.eps) ** buffer.alpha for p in (5.0, 2.0, 3.0)))


def test_a_stack_that_does_not_continue_the_episode_is_rejected_and_changes_nothing(unchanged):
    buffer = ReplayBuffer(64, _env(False), stack_compress="obs")
    steps = _episode(0, 4, "call")
    buffer.add(**steps[0])
    with unchanged(buffer), pytest.raises(ValueError, match=r"'obs'.*shifted by one frame"):
        buffer.add(**steps[2])
    buffer.add(**steps[1])


@pytest.mark.parametrize("ending", ["done", "call"])
def test_a_next_observation_no_step_of_its_episode_matches_is_rejected_at_the_episode_end(ending, unchanged):
    buffer = ReplayBuffer(64, _env(False), next_of="obs", stack_compress="obs")
    steps = _episode(0, 3, ending)
    steps[1]["next_obs"] = _observation(99, 0)
    for step in steps[:2] if ending == "done" else steps:
        buffer.add(**step)
    with unchanged(buffer), pytest.raises(ValueError, match="next_obs"):
        if ending == "done":
            buffer.add(**steps[2])  # the flagged step ends the episode
        else:
            buffer.on_episode_end()


def test_env_dict_may_omit_next_obs_as_in_cpprb():
    env = {"obs": {"shape": (2,)}, "done": {}}
    buffer = ReplayBuffer(64, env, next_of="obs")
    buffer.add(obs=np.zeros(2), next_obs=np.ones(2), done=1.0)
    batch = buffer.sample(4)
    assert np.array_equal(batch["next_obs"], np.ones((4, 2), np.float32))


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(dict(next_of="pixels"), "unknown field", id="unknown-key"),
        pytest.param(dict(stack_compress="rew"), "stack axis", id="scalar-stack"),
        pytest.param(dict(next_of="obs", lanes=0), "lanes", id="zero-lanes"),
        pytest.param(dict(lanes=2), "only compressed", id="lanes-without-compression"),
        pytest.param(dict(next_of="obs", lanes=4), "slots each", id="lanes-too-short"),
    ],
)
def test_bad_compression_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(64, _env(False), **options)


def test_compression_stores_far_fewer_bytes():
    env = {
        "obs": {"shape": (84, 84, 4), "dtype": np.uint8},
        "next_obs": {"shape": (84, 84, 4), "dtype": np.uint8},
        "act": {"dtype": np.int64},
        "rew": {},
        "done": {},
    }
    plain = ReplayBuffer(1000, env)
    compressed = ReplayBuffer(1000, env, next_of="obs", stack_compress="obs")
    assert compressed.inspection().nbytes < plain.inspection().nbytes / 7


# -- several writer processes -------------------------------------------------------


def _write_episodes(buffer, rank: int, episodes: int) -> None:
    rng = np.random.default_rng(rank)
    for e in range(episodes):
        ending = rng.choice(["done", "truncated", "call"])
        for s in _episode(rank * 10_000 + e, int(rng.integers(1, 9)), ending):
            s.setdefault("truncated", 0.0)
            buffer.add(**s)
        if ending == "call":
            buffer.on_episode_end()


def _expected(i: int) -> dict:
    episode, t = divmod(int(i), 1000)
    return {"obs": _observation(episode, t), "next_obs": _observation(episode, t + 1)}


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_three_writers_each_fill_a_lane_and_every_sample_is_exact(method):
    ctx = mp.get_context(method)
    env = _env(True)
    with MPPrioritizedReplayBuffer(3 * 64, env, next_of="obs", stack_compress="obs", lanes=3) as buffer:
        writers = [ctx.Process(target=_write_episodes, args=(buffer, r, 80)) for r in range(3)]
        for w in writers:
            w.start()
        checked = 0
        while any(w.is_alive() for w in writers) or checked == 0:
            if buffer.get_stored_size() == 0:
                continue
            batch = buffer.sample(16)
            for j, i in enumerate(batch["id"]):
                want = _expected(i)
                assert np.array_equal(batch["obs"][j], want["obs"])
                assert np.array_equal(batch["next_obs"][j], want["next_obs"])
            buffer.update_priorities(batch["indexes"], np.ones(16))
            checked += 16
        for w in writers:
            w.join(30)
            assert w.exitcode == 0
        stored = buffer.get_all_transitions()
        assert {int(i) // 1000 // 10_000 for i in stored["id"]} == {0, 1, 2}


def test_a_fourth_writer_is_told_to_create_more_lanes():
    ctx = mp.get_context("fork")
    env = _env(False)
    with MPPrioritizedReplayBuffer(64, env, next_of="obs") as buffer:
        buffer.add(**_episode(0, 1, "done")[0])
        queue = ctx.Queue()
        child = ctx.Process(target=_try_to_write, args=(buffer, queue))
        child.start()
        assert "lanes" in queue.get(timeout=30)
        child.join(10)


def _try_to_write(buffer, queue) -> None:
    try:
        buffer.add(**_episode(1, 1, "done")[0])
        queue.put("wrote")
    except ValueError as exc:
        queue.put(str(exc))


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_writer_that_closes_its_handle_gives_its_lane_to_the_next_writer(method):
    ctx = mp.get_context(method)
    env = _env(False)
    with MPPrioritizedReplayBuffer(64, env, next_of="obs") as buffer:
        writer = pickle.loads(pickle.dumps(buffer))  # this live process's own writing handle
        writer.add(**_episode(0, 1, "done")[0])
        writer.close()
        queue = ctx.Queue()
        child = ctx.Process(target=_try_to_write, args=(buffer, queue))
        child.start()
        assert queue.get(timeout=30) == "wrote"
        child.join(10)
