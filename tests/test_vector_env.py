"""Actors on vector environments: what is stored equals what a loop over each sub-environment alone stores.

A deterministic toy environment knows every transition: sub-environment ``i`` plays episodes of
known lengths that end by termination, by truncation or by both, with termination and truncation
at the same step in different sub-environments.  Its observations carry (sub-environment,
episode, step), so stored rows are matched to their sub-environment by content.
"""

from __future__ import annotations

import functools
import io
import types

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from helpers import EACH_START_METHOD, retry_after_timeouts, run_in_child

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer, SampleToInsertRatio, SequenceReplayBuffer
from mpreplay.vector_env import DISABLED, NEXT_STEP, SAME_STEP, VectorTransitions, VectorWriter, env_dict

MODES = [NEXT_STEP, SAME_STEP, DISABLED]
NUM_ENVS = 4
STACK = 2
GAMMA = 0.9
LAYOUTS = {"plain": {}, "next_of": {"next_of": "obs"}, "both": {"next_of": "obs", "stack_compress": "obs"}}


# -- the toy environment -------------------------------------------------------------


def _length(env: int, episode: int) -> int:
    return 3 if episode == 0 else 1 + (episode * (env % 3 + 1) + env) % 6


def _ending(env: int, episode: int) -> str:
    if episode == 0:  # step 3 of every sub-environment: termination in even ones, truncation in odd ones
        return "terminated" if env % 2 == 0 else "truncated"
    return ("terminated", "truncated", "both")[(env + 2 * episode) % 3]


class Toy(gym.Env):
    """Sub-environment ``env``: frames (env, episode, t), stacked by STACK, first frame repeated."""

    def __init__(self, env: int, nested: bool = False):
        self.env, self.nested, self.episode = env, nested, -1
        frames = spaces.Box(0, 255, (3, STACK), np.uint8)
        self.observation_space = (
            spaces.Dict(
                {
                    "frame": frames,
                    "pos": spaces.Tuple((spaces.Box(-np.inf, np.inf, (1,), np.float32), spaces.Discrete(4))),
                }
            )
            if nested
            else frames
        )
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        frames = np.stack(
            [np.array([self.env, self.episode, max(0, self.t - STACK + 1 + k)], np.uint8) for k in range(STACK)],
            axis=-1,
        )
        if not self.nested:
            return frames
        return {"frame": frames, "pos": (np.array([0.5 * self.t], np.float32), self.episode % 4)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        length, ending = _length(self.env, self.episode), _ending(self.env, self.episode)
        assert self.t < length, "stepped after the end of an episode"
        self.t += 1
        reward = self.env + 0.25 * self.t + 0.5 * self.episode + 0.125 * int(action)
        last = self.t == length
        return self._obs(), reward, last and ending != "truncated", last and ending != "terminated", {}


def _frames(obs):
    return obs["frame"] if isinstance(obs, dict) else obs


def _policy(obs) -> np.ndarray:
    """The action of each sub-environment, from its observation alone."""
    frames = _frames(obs)
    return (frames.reshape(len(frames), -1).astype(np.int64).sum(axis=1) % 3).astype(np.int64)


def _make(kind: str, mode: str, nested: bool = False, context: str | None = None):
    fns = [functools.partial(Toy, i, nested) for i in range(NUM_ENVS)]
    if kind == "sync":
        return SyncVectorEnv(fns, autoreset_mode=mode)
    return AsyncVectorEnv(fns, autoreset_mode=mode, context=context)


# -- the vector actor and the reference loop --------------------------------------------------


def _buffer_options(layout: str, nested: bool, lanes: int) -> dict:
    options = {k: ("obs_frame" if nested else v) for k, v in LAYOUTS[layout].items()}
    return {**options, "lanes": lanes} if options else {}


def _run_vector(env, *, nstep, truncated, layout, nested=False, steps=40):
    """Play ``steps`` vector steps into a buffer; returns (stored rows, episodes completed per sub-environment)."""
    actor = VectorTransitions(env, nstep=nstep, gamma=GAMMA, truncated=truncated)
    completed = np.zeros(NUM_ENVS, int)
    with (
        ReplayBuffer(NUM_ENVS * 256, actor.env_dict(), **_buffer_options(layout, nested, NUM_ENVS)) as buffer,
        VectorWriter(buffer, NUM_ENVS) as writer,
    ):
        obs, _ = env.reset(seed=0)
        writer.add(actor.reset(obs))
        for _ in range(steps):
            act = _policy(obs)
            obs, rew, term, trunc, info = env.step(act)
            writer.add(actor.step(act, obs, rew, term, trunc, info))
            completed += term | trunc
            if actor.autoreset_mode == DISABLED and actor.needs_reset.any():
                mask = actor.needs_reset
                obs, _ = env.reset(options={"reset_mask": mask})
                writer.add(actor.reset(obs, mask=mask))
        return buffer.get_all_transitions(), completed


def _flat(obs, prefix: str) -> dict:
    if isinstance(obs, dict):
        return {f"{prefix}_frame": obs["frame"], f"{prefix}_pos_0": obs["pos"][0], f"{prefix}_pos_1": obs["pos"][1]}
    return {prefix: obs}


def _fold(steps: list[dict], nstep: int | None, truncated: bool) -> list[dict]:
    """An episode's transitions folded over ``nstep`` steps, by the definition (float64 sums)."""
    if nstep is None:
        rows = [{k: v for k, v in s.items() if k != "truncated" or truncated} for s in steps]
        return rows
    rows = []
    for t, first in enumerate(steps):
        m = min(nstep, len(steps) - t)
        last = steps[t + m - 1]
        row = {k: v for k, v in first.items() if not k.startswith("next_") and k not in ("done", "truncated")}
        row["rew"] = sum(GAMMA**k * float(np.float32(steps[t + k]["rew"])) for k in range(m))
        row.update({k: v for k, v in last.items() if k.startswith("next_")})
        row["done"] = last["done"]
        if truncated:
            row["truncated"] = last["truncated"]
        row["discount"] = GAMMA**m
        rows.append(row)
    return rows


def _reference(env_id: int, episodes: int, *, nstep, truncated, layout, nested=False, make=None):
    """One sub-environment alone, ``episodes`` episodes, each stored as its transitions and ended."""
    env = make() if make else Toy(env_id, nested)
    fields = env_dict(env.observation_space, env.action_space, truncated=truncated, discount=nstep is not None)
    with ReplayBuffer(4096, fields, **_buffer_options(layout, nested, 1)) as buffer:
        for episode in range(episodes):
            obs, _ = env.reset(seed=env_id if episode == 0 else None)
            steps = []
            while True:
                act = int(_policy(np.asarray(_frames(obs))[None])[0])
                nxt, rew, term, trunc, _ = env.step(act)
                steps.append(
                    {
                        **_flat(obs, "obs"),
                        "act": act,
                        "rew": rew,
                        "done": term,
                        **_flat(nxt, "next_obs"),
                        "truncated": trunc,
                    }
                )
                obs = nxt
                if term or trunc:
                    break
            rows = _fold(steps, nstep, truncated)
            buffer.add(**{k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]})
            buffer.on_episode_end()
        return buffer.get_all_transitions()


def _assert_same_as_reference(stored: dict, completed: np.ndarray, env_of, reference) -> None:
    """Each sub-environment's stored rows are its reference rows, byte for byte: all those of its
    completed episodes, and a prefix of the episode in progress."""
    keys = env_of(stored)
    for i in range(NUM_ENVS):
        want = reference(i, int(completed[i]) + 1)
        got = {name: value[keys == i] for name, value in stored.items()}
        assert set(got) == set(want)
        count = len(got["rew"])
        in_completed = int((_episode_of(want) < completed[i]).sum()) if env_of is _env_of_toy else None
        if in_completed is not None:
            assert count >= in_completed, f"sub-environment {i}: {count} rows stored, {in_completed} expected at least"
        for name in want:
            assert got[name].dtype == want[name].dtype, name
            assert got[name].tobytes() == want[name][:count].tobytes(), f"sub-environment {i}, field {name!r}"


def _frames_of(rows: dict) -> np.ndarray:
    return rows["obs_frame"] if "obs_frame" in rows else rows["obs"]


def _env_of_toy(rows: dict) -> np.ndarray:
    return _frames_of(rows)[:, 0, -1]


def _episode_of(rows: dict) -> np.ndarray:
    return _frames_of(rows)[:, 1, -1]


# -- stored transitions equal the reference loop's ------------------------------------------------


@pytest.mark.parametrize("truncated", [False, True], ids=["no-truncated-field", "truncated-field"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("nstep", [None, 1, 3], ids=["no-folding", "nstep1", "nstep3"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(60, method="thread")
def test_a_sync_vector_env_stores_what_each_sub_environment_alone_stores(mode, nstep, layout, truncated):
    stored, completed = _run_vector(_make("sync", mode), nstep=nstep, truncated=truncated, layout=layout)
    assert (completed >= 3).all()
    _assert_same_as_reference(
        stored, completed, _env_of_toy, functools.partial(_reference, nstep=nstep, truncated=truncated, layout=layout)
    )


@pytest.mark.parametrize("nstep, layout", [(1, "plain"), (3, "both")])
@pytest.mark.parametrize("mode", MODES)
@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_an_async_vector_env_stores_what_each_sub_environment_alone_stores(method, mode, nstep, layout):
    env = _make("async", mode, context=method)
    try:
        stored, completed = _run_vector(env, nstep=nstep, truncated=False, layout=layout)
    finally:
        env.close()
    _assert_same_as_reference(
        stored, completed, _env_of_toy, functools.partial(_reference, nstep=nstep, truncated=False, layout=layout)
    )


@pytest.mark.parametrize("layout", ["plain", "both"])
@pytest.mark.parametrize("nstep", [None, 3], ids=["no-folding", "nstep3"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(60, method="thread")
def test_dict_and_tuple_observations_are_stored_as_one_field_per_leaf(mode, nstep, layout):
    stored, completed = _run_vector(
        _make("sync", mode, nested=True), nstep=nstep, truncated=True, layout=layout, nested=True
    )
    assert {"obs_frame", "obs_pos_0", "obs_pos_1", "next_obs_frame", "next_obs_pos_0", "next_obs_pos_1"} <= set(stored)
    _assert_same_as_reference(
        stored,
        completed,
        _env_of_toy,
        functools.partial(_reference, nstep=nstep, truncated=True, layout=layout, nested=True),
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(60, method="thread")
def test_no_stored_transition_joins_two_episodes(mode):
    stored, _ = _run_vector(_make("sync", mode), nstep=3, truncated=False, layout="plain")
    assert np.array_equal(stored["obs"][:, :2, -1], stored["next_obs"][:, :2, -1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(60, method="thread")
def test_only_terminal_steps_are_done_and_truncated_ones_bootstrap(mode):
    stored, _ = _run_vector(_make("sync", mode), nstep=3, truncated=True, layout="plain")
    env, episode = _env_of_toy(stored), _episode_of(stored)
    ending = np.array([_ending(int(i), int(e)) for i, e in zip(env, episode, strict=True)])
    ends = stored["next_obs"][:, 2, -1] == [_length(int(i), int(e)) for i, e in zip(env, episode, strict=True)]
    assert np.array_equal(stored["done"] == 1, ends & (ending != "truncated"))
    assert np.array_equal(stored["truncated"] == 1, ends & (ending != "terminated"))


# -- CartPole, 8 sub-environments --------------------------------------------------------------------

CARTPOLE_ENVS = 8


def _cartpole():
    return gym.make("CartPole-v1", max_episode_steps=30)


def _cartpole_policy(obs) -> np.ndarray:
    obs = np.atleast_2d(obs)
    return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(120, method="thread")
def test_cartpole_with_8_sub_environments_stores_what_each_alone_stores(mode):
    env = SyncVectorEnv([_cartpole] * CARTPOLE_ENVS, autoreset_mode=mode)
    actor = VectorTransitions(env, nstep=3, gamma=GAMMA)
    envs, completed = [], np.zeros(CARTPOLE_ENVS, int)
    with ReplayBuffer(100_000, actor.env_dict()) as buffer, VectorWriter(buffer, CARTPOLE_ENVS) as writer:
        obs, _ = env.reset(seed=100)
        actor.reset(obs)
        for _ in range(300):
            act = _cartpole_policy(obs)
            obs, rew, term, trunc, info = env.step(act)
            batch = actor.step(act, obs, rew, term, trunc, info)
            writer.add(batch)
            envs.append(batch.envs)
            completed += term | trunc
            if mode == DISABLED and actor.needs_reset.any():
                mask = actor.needs_reset
                obs, _ = env.reset(options={"reset_mask": mask})
                actor.reset(obs, mask=mask)
        stored = buffer.get_all_transitions()
    assert (completed >= 5).all()
    # One buffer lane, rows in the order they were added: the batches say whose each row is.
    env_of = np.concatenate(envs)

    def reference(i, n):
        # Sub-environment i was reset with seed 100 + i, then without a seed.
        cartpole = _cartpole()
        fields = env_dict(cartpole.observation_space, cartpole.action_space, discount=True)
        rows = []
        for episode in range(n):
            obs, _ = cartpole.reset(seed=100 + i if episode == 0 else None)
            steps = []
            while True:
                act = int(_cartpole_policy(obs)[0])
                nxt, rew, term, trunc, _ = cartpole.step(act)
                steps.append({"obs": obs, "act": act, "rew": rew, "done": term, "next_obs": nxt, "truncated": trunc})
                obs = nxt
                if term or trunc:
                    break
            rows += _fold(steps, 3, False)
        with ReplayBuffer(100_000, fields) as ref:
            ref.add(**{k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]})
            return ref.get_all_transitions()

    _assert_same_as_reference(stored, completed, lambda rows: env_of, reference)
    for i in range(CARTPOLE_ENVS):  # every completed episode was stored whole
        want = reference(i, int(completed[i]))
        assert (env_of == i).sum() >= len(want["rew"])


# -- episode ends, resets and refused input -------------------------------------------------------


def test_a_reset_in_the_middle_of_episodes_returns_their_pending_steps_as_truncated():
    env = _make("sync", NEXT_STEP)
    actor = VectorTransitions(env, nstep=3, gamma=GAMMA, truncated=True)
    obs, _ = env.reset(seed=0)
    actor.reset(obs)
    for _ in range(2):
        act = _policy(obs)
        obs, rew, term, trunc, info = env.step(act)
        assert len(actor.step(act, obs, rew, term, trunc, info)) == 0
    cut = actor.reset(env.reset(seed=0)[0])
    assert cut.envs.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert cut.ended.tolist() == [0, 1, 2, 3]
    assert (cut.rows["done"] == 0).all() and (cut.rows["truncated"] == 1).all()
    assert np.array_equal(cut.rows["next_obs"][:, 2, -1], [2] * 8)  # both bootstrap from step 2
    assert cut.rows["discount"].tolist() == pytest.approx([GAMMA**2, GAMMA] * 4)


def _stacks_env(dtype):
    """A vector env's face only (never stepped): observations of 4 frames stacked last."""
    return types.SimpleNamespace(
        num_envs=NUM_ENVS,
        metadata={"autoreset_mode": NEXT_STEP},
        single_observation_space=spaces.Box(0, 255, (5, 6, 4), dtype),
        single_action_space=spaces.Discrete(3),
    )


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_observations_given_as_transposed_views_of_a_reused_array_give_the_same_rows(dtype):
    env = _stacks_env(dtype)
    as_given, as_arrays = (VectorTransitions(env, nstep=3, gamma=GAMMA, truncated=True) for _ in range(2))
    rng = np.random.default_rng(3)
    frames = np.zeros((NUM_ENVS, 4, 5, 6), dtype)  # the actor's own array, (env, depth, row, col)
    view = np.moveaxis(frames, 1, -1)  # what it hands over: stacks, depth last, strided

    def batches(*step):
        return as_given.step(*step[:1], view, *step[1:]), as_arrays.step(*step[:1], view.copy(), *step[1:])

    frames[:] = rng.integers(0, 256, frames.shape)
    as_given.reset(view), as_arrays.reset(view.copy())
    for _ in range(60):
        frames[:] = rng.integers(0, 256, frames.shape)  # the same array, new values
        ends = rng.random((2, NUM_ENVS)) < 0.15
        got, want = batches(rng.integers(3, size=NUM_ENVS), rng.normal(size=NUM_ENVS), ends[0], ends[1], {})
        assert got.envs.tolist() == want.envs.tolist() and got.ended.tolist() == want.ended.tolist()
        for name, value in want.rows.items():
            assert got.rows[name].dtype == value.dtype and got.rows[name].tobytes() == value.tobytes(), name


def test_a_step_before_reset_is_refused():
    actor = VectorTransitions(_make("sync", NEXT_STEP))
    with pytest.raises(RuntimeError, match="reset"):
        actor.step(
            np.zeros(NUM_ENVS, np.int64),
            np.zeros((NUM_ENVS, 3, STACK), np.uint8),
            np.zeros(NUM_ENVS),
            np.zeros(NUM_ENVS, bool),
            np.zeros(NUM_ENVS, bool),
            {},
        )


def _play_until_an_episode_ends(env, actor):
    obs, _ = env.reset(seed=0)
    actor.reset(obs)
    while True:
        act = _policy(obs)
        obs, rew, term, trunc, info = env.step(act)
        actor.step(act, obs, rew, term, trunc, info)
        if (term | trunc).any():
            return obs, act


def test_disabled_mode_refuses_a_step_before_ended_sub_environments_are_reset():
    env = _make("sync", DISABLED)
    actor = VectorTransitions(env, nstep=3)
    obs, act = _play_until_an_episode_ends(env, actor)
    pending = actor.needs_reset
    assert pending.any()
    with pytest.raises(RuntimeError, match="reset_mask"):
        actor.step(act, obs, np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, bool), np.zeros(NUM_ENVS, bool), {})
    assert np.array_equal(actor.needs_reset, pending)


def test_same_step_mode_refuses_an_ended_episode_without_its_final_observation():
    env = _make("sync", SAME_STEP)
    actor = VectorTransitions(env, nstep=3)
    obs, _ = env.reset(seed=0)
    actor.reset(obs)
    for _ in range(2):
        act = _policy(obs)
        obs, rew, term, trunc, info = env.step(act)
        actor.step(act, obs, rew, term, trunc, info)
    act = _policy(obs)
    obs, rew, term, trunc, info = env.step(act)
    assert term.any() and "final_obs" in info
    with pytest.raises(ValueError, match="final_obs"):
        actor.step(act, obs, rew, term, trunc, {})


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"obs": np.zeros((NUM_ENVS, 3), np.uint8)}, "obs"),
        ({"actions": np.zeros(NUM_ENVS + 1, np.int64)}, "actions"),
        ({"rewards": np.zeros(2)}, "rewards"),
        ({"terminated": np.zeros((NUM_ENVS, 2), bool)}, "terminated"),
        ({"actions": np.full(NUM_ENVS, 0.5)}, "act"),
    ],
    ids=["obs-shape", "actions-count", "rewards-count", "terminated-shape", "actions-not-integers"],
)
def test_a_refused_step_changes_nothing(bad, match):
    """Two actors see the same steps; one also gets a refused step: they return the same batches."""
    env = _make("sync", NEXT_STEP)
    actors = [VectorTransitions(env, nstep=3, gamma=GAMMA) for _ in range(2)]
    obs, _ = env.reset(seed=0)
    for a in actors:
        a.reset(obs)
    for t in range(12):
        act = _policy(obs)
        obs, rew, term, trunc, info = env.step(act)
        if t == 5:
            args = {"actions": act, "obs": obs, "rewards": rew, "terminated": term, "truncated": trunc, **bad}
            with pytest.raises((ValueError, TypeError), match=match):
                actors[1].step(
                    args["actions"], args["obs"], args["rewards"], args["terminated"], args["truncated"], info
                )
        batches = [a.step(act, obs, rew, term, trunc, info) for a in actors]
        first, second = ({k: v.tobytes() for k, v in b.rows.items()} for b in batches[:2])
        assert first == second
        assert np.array_equal(batches[0].envs, batches[1].envs)


def test_the_autoreset_mode_is_read_from_the_env_metadata():
    assert VectorTransitions(_make("sync", SAME_STEP)).autoreset_mode == SAME_STEP


def test_a_given_autoreset_mode_overrides_the_metadata():
    assert VectorTransitions(_make("sync", SAME_STEP), autoreset_mode="Disabled").autoreset_mode == DISABLED


def test_an_env_without_an_autoreset_mode_must_be_given_one():
    env = _make("sync", NEXT_STEP)
    env.metadata = {}
    with pytest.raises(ValueError, match="autoreset_mode"):
        VectorTransitions(env)


def test_an_unknown_autoreset_mode_is_refused():
    with pytest.raises(ValueError, match="autoreset_mode"):
        VectorTransitions(_make("sync", NEXT_STEP), autoreset_mode="EveryStep")


# -- env_dict from spaces ---------------------------------------------------------------------


def test_env_dict_names_one_field_per_leaf_of_dict_and_tuple_spaces():
    fields = env_dict(
        Toy(0, nested=True).observation_space,
        spaces.Dict({"move": spaces.MultiDiscrete([3, 2]), "fire": spaces.MultiBinary(4)}),
        truncated=True,
        discount=True,
    )
    assert {k: (v["shape"], np.dtype(v["dtype"])) for k, v in fields.items()} == {
        "obs_frame": ((3, STACK), np.dtype(np.uint8)),
        "obs_pos_0": ((1,), np.dtype(np.float32)),
        "obs_pos_1": ((), np.dtype(np.int64)),
        "act_move": ((2,), np.dtype(np.int64)),
        "act_fire": ((4,), np.dtype(np.int8)),
        "rew": ((), np.dtype(np.float32)),
        "done": ((), np.dtype(np.float32)),
        "next_obs_frame": ((3, STACK), np.dtype(np.uint8)),
        "next_obs_pos_0": ((1,), np.dtype(np.float32)),
        "next_obs_pos_1": ((), np.dtype(np.int64)),
        "truncated": ((), np.dtype(np.float32)),
        "discount": ((), np.dtype(np.float32)),
    }


def test_env_dict_refuses_a_space_without_fixed_shape_numbers():
    with pytest.raises(TypeError, match="Text"):
        env_dict(spaces.Text(8), spaces.Discrete(2))


def test_env_dict_refuses_keys_that_flatten_to_the_same_field():
    space = spaces.Dict({"a_b": spaces.Discrete(2), "a": spaces.Dict({"b": spaces.Discrete(2)})})
    with pytest.raises(ValueError, match="obs_a_b"):
        env_dict(space, spaces.Discrete(2))


def test_env_dict_refuses_a_key_that_makes_no_field_name():
    with pytest.raises(ValueError, match="x-y"):
        env_dict(spaces.Dict({"x-y": spaces.Discrete(2)}), spaces.Discrete(2))


# -- the writer ------------------------------------------------------------------------------


def _one_batch(nstep=3):
    env = _make("sync", NEXT_STEP)
    actor = VectorTransitions(env, nstep=nstep, gamma=GAMMA)
    obs, _ = env.reset(seed=0)
    actor.reset(obs)
    batches = []
    for _ in range(6):
        act = _policy(obs)
        obs, rew, term, trunc, info = env.step(act)
        batches.append(actor.step(act, obs, rew, term, trunc, info))
    return actor, batches


def test_priorities_reach_the_rows_they_were_given_for():
    actor, batches = _one_batch()
    with (
        PrioritizedReplayBuffer(NUM_ENVS * 64, actor.env_dict(), next_of="obs", lanes=NUM_ENVS) as buffer,
        VectorWriter(buffer, NUM_ENVS) as writer,
    ):
        for batch in batches:
            # priority = 100 * sub-environment + step: what each row must carry
            writer.add(batch, priorities=100.0 * batch.envs + batch.rows["obs"][:, 2, -1])
        f = io.BytesIO()
        buffer.save_transitions(f, priorities=True)
    f.seek(0)
    saved = np.load(f)
    assert len(saved["priorities"]) > 0
    assert np.array_equal(saved["priorities"], 100.0 * saved["obs"][:, 0, -1] + saved["obs"][:, 2, -1])


def test_priorities_for_a_uniform_buffer_are_refused():
    actor, batches = _one_batch()
    with ReplayBuffer(64, actor.env_dict()) as buffer, pytest.raises(TypeError, match="priorities"):
        VectorWriter(buffer, NUM_ENVS).add(batches[-1], priorities=np.ones(len(batches[-1])))


@pytest.mark.parametrize("layout", ["plain", "next_of"])
def test_a_refused_batch_leaves_the_buffer_unchanged(layout, unchanged):
    actor, batches = _one_batch()
    batch = batches[-1]
    assert len(batch) > 1
    with PrioritizedReplayBuffer(NUM_ENVS * 64, actor.env_dict(), **_buffer_options(layout, False, NUM_ENVS)) as buffer:
        writer = VectorWriter(buffer, NUM_ENVS)
        with unchanged(buffer):
            with pytest.raises(ValueError, match="priorities"):
                writer.add(batch, priorities=np.ones(len(batch) - 1))
            with pytest.raises(ValueError, match="priorities"):
                writer.add(batch, priorities=np.r_[np.ones(len(batch) - 1), -1.0])
            bad = {**batch.rows, "act": np.full(len(batch), 0.5)}
            with pytest.raises(TypeError, match="act"):
                writer.add(type(batch)(bad, batch.envs, batch.ended))


def test_a_compressed_buffer_needs_a_lane_per_sub_environment():
    actor, batches = _one_batch()
    with ReplayBuffer(NUM_ENVS * 64, actor.env_dict(), next_of="obs", lanes=NUM_ENVS - 1) as buffer:
        writer = VectorWriter(buffer, NUM_ENVS)
        with pytest.raises(ValueError, match="lanes="):
            for batch in batches:
                writer.add(batch)


def test_closing_the_writer_gives_the_lanes_back():
    actor, batches = _one_batch()
    with ReplayBuffer(NUM_ENVS * 64, actor.env_dict(), next_of="obs", lanes=NUM_ENVS) as buffer:
        with VectorWriter(buffer, NUM_ENVS) as writer:
            writer.add(batches[-1])
        with VectorWriter(buffer, NUM_ENVS) as writer:
            writer.add(batches[-1])  # a lane still held would leave this writer none: ValueError


# -- an actor process writing a shared buffer ----------------------------------------------------


def _actor_process(buffer, nstep, layout) -> None:
    env = _make("sync", NEXT_STEP)
    actor = VectorTransitions(env, nstep=nstep, gamma=GAMMA)
    with VectorWriter(buffer, NUM_ENVS) as writer:
        obs, _ = env.reset(seed=0)
        actor.reset(obs)
        for _ in range(40):
            act = _policy(obs)
            obs, rew, term, trunc, info = env.step(act)
            writer.add(actor.step(act, obs, rew, term, trunc, info))


@pytest.mark.parametrize("layout", ["plain", "both"])
@EACH_START_METHOD
@pytest.mark.timeout(120, method="thread")
def test_an_actor_process_writes_a_shared_buffer_as_the_reference_loop_does(method, layout):
    fields = env_dict(Toy(0).observation_space, Toy(0).action_space, discount=True)
    with MPReplayBuffer(NUM_ENVS * 256, fields, **_buffer_options(layout, False, NUM_ENVS)) as buffer:
        assert run_in_child(method, _actor_process, buffer, 3, layout, timeout=100) == 0
        stored = buffer.get_all_transitions()
    completed = np.array([(_episode_of(stored)[_env_of_toy(stored) == i]).max() for i in range(NUM_ENVS)])
    _assert_same_as_reference(
        stored, completed, _env_of_toy, functools.partial(_reference, nstep=3, truncated=False, layout=layout)
    )


def test_a_batch_a_timeout_interrupted_is_finished_by_adding_it_again():
    actor, batches = _one_batch()
    options = dict(stack_compress="obs", lanes=NUM_ENVS)  # rows complete at once: they can be sampled
    # At most 4 rows ahead of the samples: a batch of several sub-environments stops part way.
    limiter = SampleToInsertRatio(1.0, 1, (-1e9, 4.0))
    with (
        ReplayBuffer(NUM_ENVS * 64, actor.env_dict(), rate_limiter=limiter, **options) as limited,
        ReplayBuffer(NUM_ENVS * 64, actor.env_dict(), **options) as free,
        VectorWriter(limited, NUM_ENVS) as writer,
        VectorWriter(free, NUM_ENVS) as reference,
    ):
        timeouts = 0
        for batch in batches:
            reference.add(batch)
            timeouts += retry_after_timeouts(functools.partial(writer.add, batch, timeout=0), lambda: limited.sample(8))
        assert timeouts > 0
        got, want = limited.get_all_transitions(), free.get_all_transitions()
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.timeout(120, method="thread")
def test_a_sequence_buffer_fed_by_a_vector_env_samples_steps_of_one_episode(mode):
    env = SyncVectorEnv([_cartpole] * CARTPOLE_ENVS, autoreset_mode=mode)
    actor = VectorTransitions(env)
    with (
        SequenceReplayBuffer(20_000, actor.env_dict(), length=8, period=4, lanes=CARTPOLE_ENVS) as buffer,
        VectorWriter(buffer, CARTPOLE_ENVS) as writer,
    ):
        obs, _ = env.reset(seed=100)
        actor.reset(obs)
        for _ in range(200):
            act = _cartpole_policy(obs)
            obs, rew, term, trunc, info = env.step(act)
            writer.add(actor.step(act, obs, rew, term, trunc, info))
            if mode == DISABLED and actor.needs_reset.any():
                mask = actor.needs_reset
                obs, _ = env.reset(options={"reset_mask": mask})
                actor.reset(obs, mask=mask)
        batch = buffer.sample(2000)
    # Each step of a sequence follows the one before in its episode: its obs is that one's next_obs.
    real = batch["mask"][:, 1:]
    assert real.any() and (~real).any()
    assert np.array_equal(batch["next_obs"][:, :-1][real], batch["obs"][:, 1:][real])
    assert not batch["done"][:, :-1][real].any()
