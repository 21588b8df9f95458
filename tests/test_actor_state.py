"""An actor restarted mid-episode: the pending steps of its n-step folder, its vector-env
transitions and its table writer, saved to a file and loaded into new ones, go on as if it had
never stopped -- no row lost, none stored twice -- and a state of another folder is refused."""

from __future__ import annotations

import numpy as np
import pytest

import mpreplay
from mpreplay import NstepBuffer, Table
from mpreplay.vector_env import VectorTransitions

pytestmark = pytest.mark.timeout(120, method="thread")

FIELDS = {"obs": {"shape": (2,)}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": (2,)}, "done": {}}


def _steps(count: int, num_envs: int | None = None) -> list[dict[str, np.ndarray]]:
    """``count`` steps (of each of ``num_envs`` environments), numbered, episodes ending every 7 steps
    (shifted per environment)."""
    envs = 1 if num_envs is None else num_envs
    out = []
    for t in range(count):
        e = np.arange(envs)
        step = {
            "obs": np.stack([np.full(envs, t), e], axis=1).astype(np.float32),
            "act": t * 10 + e,
            "rew": (t + 1.0) * (e + 1.0),
            "next_obs": np.stack([np.full(envs, t + 1), e], axis=1).astype(np.float32),
            "done": ((t + e) % 7 == 6).astype(np.float32),
        }
        out.append(step if num_envs is not None else {k: v[0] for k, v in step.items()})
    return out


def _rows(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}


def _saved(state: dict[str, np.ndarray], tmp_path) -> dict[str, np.ndarray]:
    """``state`` through a file, as a restarted actor reads it (nothing pickled)."""
    np.savez(tmp_path / "actor.npz", **state)
    with np.load(tmp_path / "actor.npz", allow_pickle=False) as f:
        return dict(f)


@pytest.mark.parametrize("num_envs", [None, 3], ids=["one-env", "three-envs"])
@pytest.mark.parametrize("stop", [1, 4, 7, 12])
def test_a_folder_restarted_from_its_saved_state_emits_every_row_once(tmp_path, num_envs, stop):
    steps = _steps(20, num_envs)
    whole = NstepBuffer(FIELDS, 3, 0.9, num_envs=num_envs)
    expected = _rows([whole.add(**s) for s in steps])
    first = NstepBuffer(FIELDS, 3, 0.9, num_envs=num_envs)
    before = [first.add(**s) for s in steps[:stop]]
    second = NstepBuffer(FIELDS, 3, 0.9, num_envs=num_envs)
    second.load_state_dict(_saved(first.state_dict(), tmp_path))
    assert second.get_pending_count() == first.get_pending_count()
    got = _rows(before + [second.add(**s) for s in steps[stop:]])
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_folder_refuses_the_state_of_another_and_keeps_its_own():
    folder = NstepBuffer(FIELDS, 3, 0.9)
    folder.add(**_steps(1)[0])
    other = NstepBuffer(FIELDS, 4, 0.9).state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['ring.obs'\]: expected shape \(1, 3, 2\)"):
        folder.load_state_dict(other)
    with pytest.raises(ValueError, match="state_dict: expected the entries"):
        folder.load_state_dict({"cursor": 0})
    bad = folder.state_dict()
    bad["pending"] = np.array([5])
    with pytest.raises(ValueError, match="pending steps per environment"):
        folder.load_state_dict(bad)
    assert folder.get_pending_count() == 1


def _priorities(table: Table) -> np.ndarray | None:
    """The raw priority of every stored row, by slot (None: a selector that keeps none)."""
    if not table.config.by_priority:
        return None
    return table.inspection().priorities(np.arange(table.get_stored_size()))[1]


@pytest.mark.parametrize("selector", ["uniform", "prioritized"])
def test_a_writer_restarted_beside_a_restored_checkpoint_stores_every_row_once(tmp_path, selector):
    steps = _steps(20)
    options = {"nstep": {"size": 3, "gamma": 0.9}, "selector": selector, "seed": 0}
    with Table(64, FIELDS, **options) as whole:
        for s in steps:
            whole.add(**s, priorities=[1.0 + s["act"]] if selector == "prioritized" else None)
        expected, expected_priorities = whole.get_all_transitions(), _priorities(whole)
    with Table(64, FIELDS, shared=True, **options) as first:
        for s in steps[:9]:  # stops mid-episode, steps pending in its folder
            first.add(**s, priorities=[1.0 + s["act"]] if selector == "prioritized" else None)
        first.checkpoint(tmp_path / "replay")
        state = _saved(first.writer_state_dict(), tmp_path)
    with mpreplay.restore(tmp_path / "replay") as again:
        again.load_writer_state_dict(state)
        for s in steps[9:]:
            again.add(**s, priorities=[1.0 + s["act"]] if selector == "prioritized" else None)
        got = again.get_all_transitions()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        np.testing.assert_array_equal(_priorities(again), expected_priorities)


def test_a_table_writer_without_folding_has_nothing_to_save_and_a_compressed_one_refuses():
    with Table(16, FIELDS) as plain:
        assert plain.writer_state_dict() == {}
        plain.load_writer_state_dict({})
        with pytest.raises(ValueError, match="state_dict: expected the entries"):
            plain.load_writer_state_dict({"cursor": 0})
    with (
        Table(64, FIELDS, next_of="obs") as compressed,
        pytest.raises(TypeError, match="writer_state_dict: a compressed or sequence table's open episode"),
    ):
        compressed.writer_state_dict()


# -- vector envs ----------------------------------------------------------------------------------

gym = pytest.importorskip("gymnasium")


class Counter(gym.Env):
    """Sub-environment ``env``: observation (env, t), reward t, episodes of 3 + env steps."""

    def __init__(self, env: int):
        self.env, self.t = env, 0
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.env, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t == 3 + self.env
        return np.array([self.env, self.t], np.float32), float(self.t), end, False, {}


def _vector_env():
    return gym.vector.SyncVectorEnv([lambda e=e: Counter(e) for e in range(3)], autoreset_mode="NextStep")


def _run(env, transitions, start: int, stop: int) -> list[dict[str, np.ndarray]]:
    """Steps ``start`` to ``stop - 1`` of ``env`` (action t % 2), through ``transitions``: their rows."""
    out = []
    for t in range(start, stop):
        actions = np.full(3, t % 2)
        out.append(transitions.step(actions, *env.step(actions)[:4]).rows)
    return out


@pytest.mark.parametrize("nstep", [None, 3])
def test_vector_transitions_restarted_from_their_saved_state_emit_every_row_once(tmp_path, nstep):
    env = _vector_env()
    whole = VectorTransitions(env, nstep=nstep, gamma=0.9)
    whole.reset(env.reset(seed=0)[0])
    expected = _rows(_run(env, whole, 0, 16))
    env = _vector_env()
    first = VectorTransitions(env, nstep=nstep, gamma=0.9)
    first.reset(env.reset(seed=0)[0])
    before = _run(env, first, 0, 5)  # the env goes on (an env restored with the actor, or one that never stopped)
    second = VectorTransitions(env, nstep=nstep, gamma=0.9)
    second.load_state_dict(_saved(first.state_dict(), tmp_path))
    got = _rows(before + _run(env, second, 5, 16))
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_vector_transitions_refuse_the_state_of_others_and_keep_their_own():
    env = _vector_env()
    folded = VectorTransitions(env, nstep=3)
    folded.reset(env.reset(seed=0)[0])
    plain = VectorTransitions(env)
    with pytest.raises(ValueError, match="state_dict: expected the entries"):
        plain.load_state_dict(folded.state_dict())
    state = folded.state_dict()
    state["obs.obs"] = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"state_dict\['obs.obs'\]: expected shape \(3, 2\)"):
        folded.load_state_dict(state)
    np.testing.assert_array_equal(folded.state_dict()["obs.obs"], env.reset(seed=0)[0])
