"""NstepBuffer: n-step folding of rewards on the actor side."""

from __future__ import annotations

import numpy as np
import pytest

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer
from mpreplay.nstep import NstepBuffer

GAMMA = 0.9


def _env_dict(obs_shape=(), rew_shape=(), truncated=False, rew_dtype=np.float64):
    env_dict = {
        "obs": {"shape": obs_shape},
        "act": {"dtype": np.int64},
        "rew": {"shape": rew_shape, "dtype": rew_dtype},
        "next_obs": {"shape": obs_shape},
        "done": {"dtype": np.bool_},
    }
    if truncated:
        env_dict["trunc"] = {}
    return env_dict


def _folder(n=3, num_envs=None, truncated=False, **env_dict_options):
    return NstepBuffer(
        _env_dict(truncated=truncated, **env_dict_options),
        n,
        GAMMA,
        truncated="trunc" if truncated else None,
        num_envs=num_envs,
    )


def _step(i, done=False, trunc=None, rew=1.0):
    """Step number ``i`` of one environment: obs, act and next_obs identify it."""
    step = {"obs": float(i), "act": i, "rew": rew, "next_obs": i + 0.5, "done": done}
    if trunc is not None:
        step["trunc"] = float(trunc)
    return step


def _concat(outputs):
    return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}


# -- a plain reference ------------------------------------------------------------
def _fold(steps, gamma, end_by_caller):
    """The n-step transition of ``steps[0]`` folded over all of ``steps``."""
    last = steps[-1]
    row = dict(steps[0])
    row["rew"] = sum(gamma**k * np.asarray(s["rew"], np.float64) for k, s in enumerate(steps))
    row["next_obs"] = last["next_obs"]
    row["done"] = last["done"]
    if "trunc" in last:
        row["trunc"] = 1.0 if end_by_caller else last["trunc"]
    row["discount"] = gamma ** len(steps)
    return row


class _Reference:
    """The specification, one step and one environment at a time, in lists."""

    def __init__(self, n, gamma, num_envs):
        self.n, self.gamma = n, gamma
        self.pending = [[] for _ in range(num_envs)]

    def add(self, steps):
        rows = []
        for pending, step in zip(self.pending, steps, strict=True):
            pending.append(step)
            if step["done"] or step.get("trunc"):
                rows += [_fold(pending[i:], self.gamma, False) for i in range(len(pending))]
                pending.clear()
            elif len(pending) == self.n:
                rows.append(_fold(pending, self.gamma, False))
                pending.pop(0)
        return rows

    def on_episode_end(self, env=None):
        rows = []
        for e, pending in enumerate(self.pending):
            if env is None or env == e:
                rows += [_fold(pending[i:], self.gamma, True) for i in range(len(pending))]
                pending.clear()
        return rows


def _random_steps(rng, first_id, num_envs, obs_shape, rew_shape, rew_dtype, truncated):
    steps = []
    for e in range(num_envs):
        i = first_id + e
        obs = np.full(obs_shape, float(i)) + np.arange(np.prod(obs_shape, dtype=int)).reshape(obs_shape) / 8
        step = {
            "obs": obs,
            "act": i,
            "rew": rng.normal(size=rew_shape).astype(rew_dtype),
            "next_obs": obs + 0.5,
            "done": bool(rng.random() < 0.08),
        }
        if truncated:
            step["trunc"] = float(rng.random() < 0.08)
        steps.append(step)
    return steps


def _check_rows(out, rows, folder):
    assert list(out) == list(folder.output_env_dict())
    for name, spec in folder.output_env_dict().items():
        assert out[name].dtype == spec["dtype"], name
        assert out[name].shape == (len(rows),) + spec["shape"], name
        expected = np.array([r[name] for r in rows], dtype=spec["dtype"]).reshape(out[name].shape)
        np.testing.assert_allclose(out[name], expected, rtol=1e-6, err_msg=name)


def _run_against_reference(
    n, num_envs, obs_shape=(), rew_shape=(), truncated=False, calls=150, seed=0, rew_dtype=np.float64, gamma=GAMMA
):
    """Random episodes with random terminal/truncated ends and caller ends; every output checked.

    Returns the act ids added and the act ids emitted, in emission order.
    """
    rng = np.random.default_rng(seed)
    folder = NstepBuffer(
        _env_dict(obs_shape, rew_shape, truncated, rew_dtype),
        n,
        gamma,
        truncated="trunc" if truncated else None,
        num_envs=num_envs,
    )
    envs = num_envs or 1
    reference = _Reference(n, gamma, envs)
    added, emitted = [], []
    for call in range(calls):
        steps = _random_steps(rng, call * envs, envs, obs_shape, rew_shape, rew_dtype, truncated)
        added += [s["act"] for s in steps]
        batch = steps[0] if num_envs is None else {k: np.array([s[k] for s in steps]) for k in steps[0]}
        out = folder.add(**batch)
        _check_rows(out, reference.add(steps), folder)
        emitted += list(out["act"])
        if rng.random() < 0.1:
            env = None if num_envs is None or rng.random() < 0.5 else int(rng.integers(envs))
            out = folder.on_episode_end(env)
            _check_rows(out, reference.on_episode_end(env), folder)
            emitted += list(out["act"])
        assert folder.get_pending_count() == sum(len(p) for p in reference.pending)
    out = folder.on_episode_end()
    _check_rows(out, reference.on_episode_end(), folder)
    emitted += list(out["act"])
    return added, emitted


@pytest.mark.parametrize("truncated", [False, True], ids=["done-only", "with-truncated"])
@pytest.mark.parametrize("obs_shape", [(), (3,)], ids=["scalar-obs", "vector-obs"])
@pytest.mark.parametrize("num_envs", [None, 1, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_emitted_row_matches_the_reference(n, num_envs, obs_shape, truncated):
    _run_against_reference(n, num_envs, obs_shape, truncated=truncated, seed=n * 10 + (num_envs or 0))


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("num_envs", [2, 8])
@pytest.mark.parametrize("n", [1, 3, 6])
def test_every_emitted_row_matches_the_reference_for_any_gamma_and_vector_size(n, num_envs, gamma):
    _run_against_reference(
        n, num_envs, (2,), (3,), truncated=True, calls=80, seed=n + num_envs, rew_dtype=np.float32, gamma=gamma
    )


@pytest.mark.parametrize("num_envs", [None, 3])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_every_step_is_emitted_exactly_once(n, num_envs):
    added, emitted = _run_against_reference(n, num_envs, truncated=True, calls=100, seed=7)
    assert sorted(emitted) == added


def test_vector_rewards_are_folded_per_component():
    _run_against_reference(3, 3, obs_shape=(2,), rew_shape=(2,), truncated=True)


def test_float32_rewards_are_folded_in_float64_and_emitted_as_float32():
    _run_against_reference(5, 3, rew_dtype=np.float32)


# -- when rows are emitted ------------------------------------------------------------
def test_a_step_is_emitted_once_n_steps_follow_it():
    folder = _folder(n=3)
    assert [len(folder.add(**_step(i))["act"]) for i in range(5)] == [0, 0, 1, 1, 1]
    assert folder.get_pending_count() == 2


def test_empty_output_has_every_field_with_zero_rows():
    folder = _folder(n=2, truncated=True, obs_shape=(3,))
    out = folder.add(**_step(0, trunc=0, rew=1.0) | {"obs": np.zeros(3), "next_obs": np.zeros(3)})
    for name, spec in folder.output_env_dict().items():
        assert out[name].shape == (0,) + spec["shape"] and out[name].dtype == spec["dtype"], name


def test_a_done_step_flushes_its_episode_with_shorter_folds():
    folder = _folder(n=3)
    folder.add(**_step(0, rew=1.0))
    out = folder.add(**_step(1, rew=2.0, done=True))
    np.testing.assert_array_equal(out["act"], [0, 1])
    np.testing.assert_allclose(out["rew"], [1.0 + GAMMA * 2.0, 2.0])
    np.testing.assert_allclose(out["discount"], [GAMMA**2, GAMMA], rtol=1e-6)
    np.testing.assert_array_equal(out["next_obs"], [1.5, 1.5])
    np.testing.assert_array_equal(out["done"], [True, True])
    assert folder.get_pending_count() == 0


def test_terminal_stops_bootstrapping_and_truncated_keeps_it():
    def last_rows(done, trunc):
        folder = _folder(n=3, truncated=True)
        folder.add(**_step(0, trunc=0.0, rew=1.0))
        return folder.add(**_step(1, done=done, trunc=trunc, rew=2.0))

    terminal, truncated = last_rows(True, 0.0), last_rows(False, 1.0)
    for name in ("obs", "act", "rew", "next_obs", "discount"):
        np.testing.assert_array_equal(terminal[name], truncated[name], err_msg=name)
    np.testing.assert_array_equal(terminal["done"], [True, True])
    np.testing.assert_array_equal(truncated["done"], [False, False])
    np.testing.assert_array_equal(truncated["trunc"], [1.0, 1.0])

    def target(rows, value_of_next=10.0):
        return rows["rew"] + rows["discount"] * (1.0 - rows["done"]) * value_of_next

    np.testing.assert_allclose(target(terminal), [1.0 + GAMMA * 2.0, 2.0])
    np.testing.assert_allclose(target(truncated), target(terminal) + 10.0 * np.array([GAMMA**2, GAMMA]), rtol=1e-6)


def test_on_episode_end_flushes_as_if_the_last_step_were_truncated():
    flagged, ended = _folder(n=4, truncated=True), _folder(n=4, truncated=True)
    for i in range(3):
        flagged_out = flagged.add(**_step(i, trunc=float(i == 2), rew=float(i)))
        assert len(ended.add(**_step(i, trunc=0.0, rew=float(i)))["act"]) == 0
    ended_out = ended.on_episode_end()
    assert len(flagged_out["act"]) == 3
    for name in flagged_out:
        np.testing.assert_array_equal(ended_out[name], flagged_out[name], err_msg=name)


def test_on_episode_end_without_a_truncated_field_bootstraps():
    folder = _folder(n=3)
    folder.add(**_step(0, rew=1.0))
    folder.add(**_step(1, rew=2.0))
    out = folder.on_episode_end()
    np.testing.assert_array_equal(out["act"], [0, 1])
    np.testing.assert_array_equal(out["done"], [False, False])
    np.testing.assert_allclose(out["rew"], [1.0 + GAMMA * 2.0, 2.0])
    np.testing.assert_allclose(out["discount"], [GAMMA**2, GAMMA], rtol=1e-6)
    np.testing.assert_array_equal(out["next_obs"], [1.5, 1.5])


def test_the_episode_after_an_end_folds_nothing_from_the_one_before():
    folder = _folder(n=3)
    folder.add(**_step(0, rew=100.0))
    folder.on_episode_end()
    for i in range(1, 3):
        folder.add(**_step(i, rew=1.0))
    out = folder.add(**_step(3, rew=1.0))
    np.testing.assert_array_equal(out["act"], [1])
    np.testing.assert_allclose(out["rew"], [1.0 + GAMMA + GAMMA**2])


# -- vectorised environments -------------------------------------------------------
def _batch(steps):
    return {k: np.array([s[k] for s in steps]) for k in steps[0]}


def test_rows_of_several_envs_are_ordered_by_env_then_time():
    folder = _folder(n=3, num_envs=3, truncated=True)
    for t in range(2):
        folder.add(**_batch([_step(10 * e + t, trunc=0.0) for e in range(3)]))
    out = folder.add(**_batch([_step(2, done=True, trunc=0.0), _step(12, trunc=0.0), _step(22, trunc=1.0)]))
    np.testing.assert_array_equal(out["act"], [0, 1, 2, 10, 20, 21, 22])
    np.testing.assert_array_equal(out["done"], [True, True, True, False, False, False, False])
    np.testing.assert_array_equal(out["trunc"], [0, 0, 0, 0, 1, 1, 1])


def test_on_episode_end_of_one_env_leaves_the_others_pending():
    folder = _folder(n=3, num_envs=3)
    for t in range(2):
        folder.add(**_batch([_step(10 * e + t) for e in range(3)]))
    out = folder.on_episode_end(env=1)
    np.testing.assert_array_equal(out["act"], [10, 11])
    assert [folder.get_pending_count(e) for e in range(3)] == [2, 0, 2]
    assert folder.get_pending_count() == 4


# -- feeding a replay buffer -----------------------------------------------------------
@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_outputs_feed_a_replay_buffer_including_zero_rows(buffer_class):
    env_dict = _env_dict(obs_shape=(2,), truncated=True)
    folder = NstepBuffer(env_dict, 3, GAMMA, truncated="trunc", num_envs=2)
    buffer = buffer_class(64, {**env_dict, "discount": {}})
    outputs = []
    for t in range(6):
        steps = [
            _step(10 * e + t, done=(e == 0 and t == 4), trunc=0.0)
            | {"obs": np.full(2, t), "next_obs": np.full(2, t + 1)}
            for e in range(2)
        ]
        outputs.append(folder.add(**_batch(steps)))
        buffer.add(**outputs[-1])
    assert any(len(o["act"]) == 0 for o in outputs)
    stored = buffer.get_all_transitions()
    expected = _concat(outputs)
    assert buffer.get_stored_size() == len(expected["act"])
    for name in stored:
        np.testing.assert_array_equal(stored[name], expected[name], err_msg=name)


def test_output_env_dict_is_the_input_fields_plus_a_float32_discount():
    folder = _folder(truncated=True, obs_shape=(3,))
    out_env_dict = folder.output_env_dict()
    assert list(out_env_dict) == list(_env_dict(truncated=True)) + ["discount"]
    assert out_env_dict["discount"] == {"shape": (), "dtype": np.dtype(np.float32)}
    assert out_env_dict["obs"] == {"shape": (3,), "dtype": np.dtype(np.float32)}
    assert out_env_dict["done"]["dtype"] == np.bool_


def test_a_declared_discount_sets_its_dtype_and_is_not_an_input():
    folder = NstepBuffer({**_env_dict(), "discount": {"dtype": np.float64}}, 1, GAMMA)
    assert folder.output_env_dict()["discount"]["dtype"] == np.float64
    assert folder.add(**_step(0))["discount"].dtype == np.float64
    with pytest.raises(ValueError, match="'discount'"):
        folder.add(**_step(1), discount=1.0)


def test_rows_emitted_later_do_not_change_rows_returned_earlier():
    folder = _folder(n=1)
    first = folder.add(**_step(0))
    snapshot = {k: v.copy() for k, v in first.items()}
    for i in range(1, 4):
        folder.add(**_step(i))
    for name in first:
        np.testing.assert_array_equal(first[name], snapshot[name], err_msg=name)


def test_large_rows_kept_by_the_caller_never_change_while_dropped_ones_are_let_go():
    # Rows of 32 KB: their arrays are made where rows handed out earlier were, once let go.
    folder = _folder(n=2, num_envs=4, obs_shape=(64, 64))
    rng = np.random.default_rng(5)
    kept = []
    for i in range(200):
        obs = rng.normal(size=(4, 64, 64))
        out = folder.add(obs=obs, act=np.arange(4), rew=np.ones(4), next_obs=obs, done=rng.random(4) < 0.1)
        if i % 3 == 0:
            view = out["obs"][1:]  # a view keeps its rows as the dict would
            kept.append((out, view, {k: v.copy() for k, v in out.items()}, view.copy()))
    for out, view, values, view_values in kept:
        for name, value in values.items():
            np.testing.assert_array_equal(out[name], value, err_msg=name)
        np.testing.assert_array_equal(view, view_values)


def test_add_copies_the_caller_arrays():
    folder = _folder(n=2, obs_shape=(2,))
    obs = np.zeros(2)
    folder.add(**_step(0) | {"obs": obs, "next_obs": obs + 1})
    obs[:] = 99.0
    out = folder.add(**_step(1) | {"obs": obs, "next_obs": obs + 1})
    np.testing.assert_array_equal(out["obs"], [[0.0, 0.0]])


# -- pending steps ------------------------------------------------------------------
def test_clear_drops_pending_steps_without_emitting_them():
    folder = _folder(n=3)
    folder.add(**_step(0, rew=100.0))
    folder.add(**_step(1, rew=100.0))
    folder.clear()
    assert folder.get_pending_count() == 0
    assert len(folder.on_episode_end()["act"]) == 0
    folder.add(**_step(2, rew=1.0))
    out = folder.add(**_step(3, rew=1.0, done=True))
    np.testing.assert_array_equal(out["act"], [2, 3])
    np.testing.assert_allclose(out["rew"], [1.0 + GAMMA, 1.0])


# -- bad input -------------------------------------------------------------------------
_BAD_STEPS = {
    "missing field": (lambda b: {k: v for k, v in b.items() if k != "rew"}, ValueError, "'rew'"),
    "unknown field": (lambda b: b | {"priorities": [1.0, 1.0]}, ValueError, "'priorities'"),
    "wrong shape": (lambda b: b | {"next_obs": np.zeros((2, 3))}, ValueError, "'next_obs'"),
    "fields disagree on the batch": (lambda b: b | {"obs": [0.0, 1.0, 2.0]}, ValueError, "'obs'"),
    "not one step per env": (lambda b: {k: v[:1] for k, v in b.items()}, ValueError, "num_envs=2"),
    "lossy cast": (lambda b: b | {"act": [0.5, 1.5]}, TypeError, "'act'"),
    "not numbers": (lambda b: b | {"rew": ["a", "b"]}, TypeError, "'rew'"),
}


@pytest.mark.parametrize("case", list(_BAD_STEPS))
def test_a_bad_step_raises_naming_the_problem_and_changes_nothing(case):
    spoil, error, fragment = _BAD_STEPS[case]
    folder, twin = (_folder(n=3, num_envs=2, truncated=True) for _ in range(2))

    def batch(t, done=False):
        return _batch([_step(10 * e + t, done=done and e == 0, trunc=0.0) for e in range(2)])

    for t in range(2):
        folder.add(**batch(t))
        twin.add(**batch(t))
    with pytest.raises(error, match=fragment):
        folder.add(**spoil(batch(2)))
    assert folder.get_pending_count() == twin.get_pending_count()
    for t, done in ((2, False), (3, True), (4, False)):
        got, want = folder.add(**batch(t, done)), twin.add(**batch(t, done))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    got, want = folder.on_episode_end(), twin.on_episode_end()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("env", [3, -1, 1.0, True])
def test_on_episode_end_rejects_an_unknown_env(env):
    folder = _folder(num_envs=3)
    with pytest.raises(ValueError, match="env"):
        folder.on_episode_end(env)


_BAD_ARGUMENTS = {
    "size 0": ({"size": 0}, ValueError, "size"),
    "size not int": ({"size": 2.0}, ValueError, "size"),
    "gamma above 1": ({"gamma": 1.5}, ValueError, "gamma"),
    "gamma nan": ({"gamma": float("nan")}, ValueError, "gamma"),
    "num_envs 0": ({"num_envs": 0}, ValueError, "num_envs"),
    "unknown rew": ({"rew": "reward"}, ValueError, "rew: field 'reward'"),
    "unknown next": ({"next": "obs2"}, ValueError, "next: field 'obs2'"),
    "unknown done": ({"done": "terminal"}, ValueError, "done: field 'terminal'"),
    "unknown truncated": ({"truncated": "timeout"}, ValueError, "truncated: field 'timeout'"),
    "shared key": ({"truncated": "done"}, ValueError, "different fields"),
    "integer reward": ({"rew": "act"}, TypeError, "rew: field 'act' must have a float dtype"),
    "vector done": ({"done": "obs"}, ValueError, "done: field 'obs' must be a scalar"),
}


@pytest.mark.parametrize("case", list(_BAD_ARGUMENTS))
def test_the_constructor_rejects_bad_arguments(case):
    overrides, error, fragment = _BAD_ARGUMENTS[case]
    arguments = {"env_dict": _env_dict(obs_shape=(2,)), "size": 3, "gamma": GAMMA} | overrides
    with pytest.raises(error, match=fragment):
        NstepBuffer(**arguments)


def test_the_constructor_rejects_a_discount_that_is_not_a_float_scalar():
    with pytest.raises(ValueError, match="'discount'"):
        NstepBuffer({**_env_dict(), "discount": {"shape": 2}}, 3, GAMMA)


def test_consecutive_steps_in_one_add_emit_what_single_adds_emit():
    steps = [_step(i, done=(i == 4)) for i in range(7)]
    single = _folder()
    want = _concat([single.add(**s) for s in steps])
    got = _folder().add(**{k: np.array([s[k] for s in steps]) for k in steps[0]})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_check_counts_the_steps_of_a_call_without_taking_them():
    folder = _folder()
    assert folder.check(**{k: np.array([v, v]) for k, v in _step(0).items()}) == 2
    assert folder.get_pending_count() == 0


def test_check_refuses_what_add_refuses():
    folder = _folder(num_envs=2)
    with pytest.raises(ValueError, match="num_envs"):
        folder.check(**{k: np.array([v] * 3) for k, v in _step(0).items()})


def test_several_reward_fields_fold_alike():
    env_dict = {**_env_dict(), "bonus": {"dtype": np.float64}}
    folder = NstepBuffer(env_dict, 2, GAMMA, rew=["rew", "bonus"])
    folder.add(**_step(0, rew=1.0), bonus=10.0)
    out = folder.add(**_step(1, rew=2.0), bonus=20.0)
    np.testing.assert_allclose(out["rew"], [1 + GAMMA * 2])
    np.testing.assert_allclose(out["bonus"], [10 + GAMMA * 20])


def test_without_reward_fields_nothing_is_folded():
    folder = NstepBuffer(_env_dict(), 2, GAMMA, rew=None)
    folder.add(**_step(0, rew=1.0))
    np.testing.assert_allclose(folder.add(**_step(1, rew=2.0))["rew"], [1.0])


@pytest.mark.parametrize("rew", [3, ["rew", 3], {"rew": 1}], ids=["number", "list-with-number", "mapping"])
def test_reward_names_that_are_no_names_are_refused(rew):
    with pytest.raises(TypeError, match="rew"):
        NstepBuffer(_env_dict(), 2, GAMMA, rew=rew)
