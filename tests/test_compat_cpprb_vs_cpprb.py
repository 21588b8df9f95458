"""``mpreplay.compat.cpprb`` side by side with the real cpprb, on the same random transitions.

Runs where cpprb is installed (the ``bench`` extra installs it); skipped otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

real = pytest.importorskip("cpprb", reason="cpprb is not installed (pip install '.[bench]' installs it)")

from mpreplay.compat import cpprb as compat

ENV = {
    "obs": {"shape": (4,)},
    "act": {"dtype": np.int64},
    "rew": {},
    "next_obs": {"shape": (4,)},
    "done": {"shape": 1},
    "mask": {"shape": (2, 3), "dtype": np.uint8},
}
SIZE, BATCH = 64, 16


def _transitions(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "obs": rng.standard_normal(4).astype(np.float32),
            "act": int(rng.integers(0, 4)),
            "rew": float(rng.standard_normal()),
            "next_obs": rng.standard_normal(4).astype(np.float32),
            "done": float(rng.random() < 0.1),
            "mask": rng.integers(0, 2, (2, 3)).astype(np.uint8),
        }
        for _ in range(n)
    ]


def _pair(kind: str, **options):
    return getattr(real, kind)(SIZE, ENV, **options), getattr(compat, kind)(SIZE, ENV, **options)


def _fill(buffers, transitions, batch: int = 1) -> None:
    for start in range(0, len(transitions), batch):
        chunk = transitions[start : start + batch]
        values = chunk[0] if batch == 1 else {k: np.stack([np.asarray(t[k]) for t in chunk]) for k in chunk[0]}
        for b in buffers:
            b.add(**values)


def _assert_same_layout(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    for name in theirs:
        assert ours[name].shape == theirs[name].shape, name
        assert ours[name].dtype == theirs[name].dtype, name


@pytest.mark.parametrize("kind", ["ReplayBuffer", "PrioritizedReplayBuffer"])
@pytest.mark.parametrize("batch", [1, 7], ids=["one-by-one", "batches"])
def test_the_stored_transitions_are_cpprbs_value_for_value(kind, batch):
    theirs, ours = _pair(kind)
    _fill([theirs, ours], _transitions(150), batch)  # wraps the ring twice
    want, got = theirs.get_all_transitions(), ours.get_all_transitions()
    _assert_same_layout(got, want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert ours.get_stored_size() == theirs.get_stored_size()
    assert ours.get_next_index() == theirs.get_next_index()


@pytest.mark.parametrize(
    "kind", ["ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer", "MPPrioritizedReplayBuffer"]
)
def test_every_sample_has_cpprbs_keys_shapes_and_dtypes(kind):
    theirs, ours = _pair(kind)
    _fill([theirs, ours], _transitions(40))
    _assert_same_layout(ours.sample(BATCH), theirs.sample(BATCH))


@pytest.mark.parametrize("kind", ["PrioritizedReplayBuffer", "MPPrioritizedReplayBuffer"])
def test_weights_and_indexes_follow_cpprbs_conventions(kind):
    theirs, ours = _pair(kind, alpha=0.7)
    _fill([theirs, ours], _transitions(40))
    got, want = ours.sample(BATCH, beta=0.5), theirs.sample(BATCH, beta=0.5)
    for batch in (got, want):
        assert batch["weights"].dtype == np.float32 and batch["weights"].shape == (BATCH,)
        assert batch["indexes"].dtype == np.uint64 and batch["indexes"].shape == (BATCH,)
        np.testing.assert_allclose(batch["weights"], 1.0)  # equal priorities: every weight is 1
    assert ours.get_max_priority() == theirs.get_max_priority() == 1.0


def test_importance_weights_equal_cpprbs_for_the_same_slots():
    theirs, ours = _pair("PrioritizedReplayBuffer", alpha=0.6, eps=1e-4)
    transitions = _transitions(SIZE)
    priorities = np.random.default_rng(1).uniform(0.1, 3.0, SIZE)
    for t, p in zip(transitions, priorities, strict=True):
        theirs.add(**t, priorities=p)
        ours.add(**t, priorities=p)
    want = theirs.sample(256, beta=0.4)
    got = ours.sample(256, beta=0.4)
    # Different random draws, one formula: compare each slot's weight where both drew it.
    wanted = dict(zip(want["indexes"].tolist(), want["weights"].tolist(), strict=True))
    common = [(i, w) for i, w in zip(got["indexes"].tolist(), got["weights"].tolist(), strict=True) if i in wanted]
    assert common
    for slot, weight in common:
        assert weight == pytest.approx(wanted[slot], rel=1e-5), slot


def test_the_max_priority_follows_cpprbs_running_maximum():
    theirs, ours = _pair("PrioritizedReplayBuffer")
    _fill([theirs, ours], _transitions(8))
    for b in (theirs, ours):
        b.update_priorities(np.arange(8), np.full(8, 4.0))
        b.update_priorities(np.arange(8), np.full(8, 0.5))
        b.add(**_transitions(1, seed=3)[0])
    assert ours.get_max_priority() == theirs.get_max_priority() == 4.0


def test_nstep_rows_equal_cpprbs_where_no_episode_ends():
    nstep = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}
    theirs, ours = _pair("ReplayBuffer", Nstep=nstep)
    transitions = [{**t, "done": 0.0} for t in _transitions(50)]
    _fill([theirs, ours], transitions)
    want, got = theirs.get_all_transitions(), ours.get_all_transitions()
    _assert_same_layout(got, want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)  # cpprb folds in float32


def test_nstep_rows_differ_from_cpprbs_only_where_documented():
    # cpprb leaves the last folded step's done out of the rows add() stores, and gives the
    # rows on_episode_end() stores a next_obs of ones: the README's table lists both.
    nstep = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}
    theirs, ours = _pair("ReplayBuffer", Nstep=nstep)
    dones = [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]
    transitions = [{**t, "done": float(d)} for t, d in zip(_transitions(len(dones)), dones, strict=True)]
    _fill([theirs, ours], transitions)
    for b in (theirs, ours):
        b.on_episode_end()
    want, got = theirs.get_all_transitions(), ours.get_all_transitions()
    n = len(dones)
    window_done = np.array([max(dones[t : t + 3]) for t in range(n)], dtype=np.float32)[:, None]
    np.testing.assert_array_equal(got["done"], window_done)
    flushed = np.arange(n) >= n - 2
    np.testing.assert_array_equal(got["next_obs"][flushed], np.stack([transitions[-1]["next_obs"]] * 2))
    same = ~flushed
    for name in ("obs", "act", "rew", "mask"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)  # cpprb folds in float32
    np.testing.assert_array_equal(got["next_obs"][same], want["next_obs"][same])


def test_a_file_cpprb_saved_loads_into_the_compat_buffer(tmp_path):
    theirs, ours = _pair("ReplayBuffer")
    _fill([theirs], _transitions(20))
    path = tmp_path / "cpprb.npz"
    theirs.save_transitions(str(path))
    ours.load_transitions(str(path))
    for name, rows in theirs.get_all_transitions().items():
        np.testing.assert_array_equal(ours.get_all_transitions()[name], rows, err_msg=name)


def test_an_env_dict_cpprb_was_given_serves_the_compat_buffer_too():
    env_dict = {name: dict(options) for name, options in ENV.items()}
    theirs = real.ReplayBuffer(SIZE, env_dict)  # cpprb writes add_shape into env_dict
    ours = compat.ReplayBuffer(SIZE, env_dict)
    _fill([theirs, ours], _transitions(5))
    _assert_same_layout(ours.get_all_transitions(), theirs.get_all_transitions())
