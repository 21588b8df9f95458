"""The numba sum tree of ``bench per --peers`` (mpreplay.bench.numba_tree): its draws and weights.

numba lives in the peers' venv, not here: these tests run the same kernels as plain Python, through
a stand-in ``numba`` whose ``njit`` returns the function it is given (what numba compiles is that
function's Python).  tests/test_bench_peers.py runs the compiled tree in the peers' venv.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from mpreplay.bench import numba_tree
from mpreplay.bench.peer_worker import env_dict

ALPHA, BETA, EPS = 0.6, 0.4, 1e-4


@pytest.fixture(autouse=True)
def python_kernels(monkeypatch):
    stand_in = types.ModuleType("numba")
    stand_in.njit = lambda **options: lambda function: function  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "numba", stand_in)
    monkeypatch.setattr(numba_tree, "_KERNELS", {})


def _filled(priorities: np.ndarray, capacity: int | None = None) -> numba_tree.NumbaPER:
    buffer = numba_tree.NumbaPER(capacity or len(priorities), 0, env_dict(None), ALPHA, BETA, EPS)
    n = len(priorities)
    columns = {name: np.zeros((n, *spec.get("shape", ())), spec["dtype"]) for name, spec in env_dict(None).items()}
    columns["act"] = np.arange(n)
    buffer.fill(columns, priorities)
    return buffer


def test_draws_follow_the_priorities_to_the_power_alpha():
    priorities = np.array([0.1, 1.0, 2.0, 4.0, 0.5])
    buffer = _filled(priorities)
    counts = np.bincount(np.concatenate([buffer.sample(50)["indexes"] for _ in range(400)]), minlength=5)
    expected = (priorities + EPS) ** ALPHA / ((priorities + EPS) ** ALPHA).sum()
    assert np.allclose(counts / counts.sum(), expected, atol=0.015)


def test_a_sample_returns_the_drawn_rows_and_their_importance_weights():
    priorities = np.array([0.1, 1.0, 2.0, 4.0, 0.5])
    buffer = _filled(priorities)
    batch = buffer.sample(32)
    assert np.array_equal(batch["act"], batch["indexes"])
    leaf = (priorities + EPS) ** ALPHA
    assert np.allclose(batch["weights"], (leaf[batch["indexes"]] / leaf.min()) ** -BETA)
    assert batch["weights"].max() <= 1.0


def test_an_update_moves_the_draws_to_the_new_priorities():
    buffer = _filled(np.ones(8))
    buffer.update_priorities(np.arange(8), np.array([0, 0, 0, 5.0, 0, 0, 0, 0]))
    drawn = np.concatenate([buffer.sample(16)["indexes"] for _ in range(20)])
    assert np.mean(drawn == 3) > 0.99


def test_an_add_stores_its_row_at_the_highest_priority_seen():
    buffer = _filled(np.array([1.0, 3.0]), capacity=4)
    buffer.add(obs=np.ones(4, np.float32), act=7, rew=1.0, next_obs=np.ones(4, np.float32), done=0.0)
    assert buffer.stored == 3 and buffer.fields["act"][2] == 7
    assert buffer.sums[buffer.leaf0 + 2] == pytest.approx((3.0 + EPS) ** ALPHA)
    assert buffer.sums[1] == pytest.approx(buffer.sums[buffer.leaf0 : buffer.leaf0 + 3].sum())


def test_adds_past_the_capacity_overwrite_the_oldest_row():
    buffer = _filled(np.ones(4))
    for act in (10, 11):
        buffer.add(obs=np.zeros(4, np.float32), act=act, rew=0.0, next_obs=np.zeros(4, np.float32), done=0.0)
    assert buffer.fields["act"].tolist() == [10, 11, 2, 3] and buffer.stored == 4
