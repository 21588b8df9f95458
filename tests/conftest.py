"""The fixtures every test file may use: buffer state snapshots, a chi-square frequency check,
unaligned arrays, default termination signals, no peers' venv.  Plain helpers are in helpers.py."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from mpreplay.bench.peers import ENV_VAR
from mpreplay.memory import SHM_DIR, segment_name

# The shared helpers' asserts report their operands as a test's own do.
pytest.register_assert_rewrite("helpers")


def _buffer_state(buffer: Any) -> dict[str, bytes]:
    """The bytes of every array of a buffer's memory block: header, generations, trees, fields."""
    return {name: arr.tobytes() for name, arr in buffer.inspection().arrays.items()}


@pytest.fixture
def unchanged():
    """``with unchanged(buffer): ...`` fails unless the block leaves every bit
    of the buffer's state as it found it."""

    @contextlib.contextmanager
    def check(buffer: Any) -> Iterator[None]:
        before = _buffer_state(buffer)
        yield
        after = _buffer_state(buffer)
        changed = [name for name in before if before[name] != after[name]]
        assert not changed, f"the buffer changed: {changed}"

    return check


@pytest.fixture
def default_termination_signals():
    """SIGTERM and SIGHUP at their default action while the test runs, as in a program that sets
    neither; a handler an earlier test left in this process (Ray's driver sets one) comes back after."""
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture
def memory_of():
    """``memory_of(buffer)``: the bytes of each array of the buffer's memory, by name, to compare
    with a later reading (for a check that applies only when a call raises)."""
    return _buffer_state


def _chi_square_critical(dof: int, significance: float) -> float:
    # Wilson-Hilferty approximation (no scipy): within 5% for dof >= 3 at small
    # significance, erring high, so it never makes the test stricter than exact.
    z = NormalDist().inv_cdf(1.0 - significance)
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * h**0.5) ** 3


@pytest.fixture
def assert_frequencies():
    """``assert_frequencies(counts, probabilities)``: Pearson's chi-square test
    that ``counts`` were drawn with ``probabilities`` (rejecting at 1e-5).

    Cells of probability 0 must have count 0.
    """

    def check(counts: np.ndarray, probabilities: np.ndarray, significance: float = 1e-5) -> None:
        counts = np.asarray(counts, dtype=np.float64)
        probabilities = np.asarray(probabilities, dtype=np.float64)
        possible = probabilities > 0
        assert counts[~possible].sum() == 0, f"drew impossible cells {np.flatnonzero(~possible & (counts > 0))}"
        expected = counts.sum() * probabilities[possible] / probabilities[possible].sum()
        assert expected.min() >= 5, "too few draws for a chi-square test"
        observed = counts[possible]
        statistic = float(((observed - expected) ** 2 / expected).sum())
        critical = _chi_square_critical(len(expected) - 1, significance)
        assert statistic < critical, (
            f"chi-square {statistic:.1f} >= {critical:.1f}: counts {observed} vs expected {expected}"
        )

    return check


@pytest.fixture
def unaligned():
    """``unaligned(array)``: a copy of a 1-D ``array`` one byte into a buffer, C-contiguous but not aligned."""

    def make(array: np.ndarray) -> np.ndarray:
        raw = np.zeros(array.nbytes + 1, np.uint8)
        view = np.frombuffer(raw.data, dtype=array.dtype, count=len(array), offset=1)
        view[...] = array
        assert not view.flags.aligned
        return view

    return make


@pytest.fixture
def no_peers_venv(monkeypatch):
    """No peers' venv named in the environment while the test runs (the benchmarks then skip
    the peers' tables, saying how to run them)."""
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def table_name():
    """A table name no other table on this machine has (the runs of other test sessions share
    /dev/shm).  A segment of that name still there after the test (a persistent table the test
    did not remove) is removed, and fails the test."""
    name = f"test-{os.getpid()}-{secrets.token_hex(4)}"
    yield name
    leftover = os.path.join(SHM_DIR, segment_name(name))
    if os.path.exists(leftover):
        os.unlink(leftover)
        pytest.fail(f"the test left {leftover} behind")
