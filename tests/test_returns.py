"""Specification of mpreplay.returns: discounted sums, n-step returns and GAE."""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpreplay.returns import (
    discounted_cumsum_left,
    discounted_cumsum_right,
    gae,
    n_step_returns,
)

DIRECTIONS = {"right": discounted_cumsum_right, "left": discounted_cumsum_left}


# --- plain Python float64 references ------------------------------------------------------------


def reference_row(x, links, right):
    """One row; ``links[t]`` joins step t to step t + 1."""
    x, links = [float(v) for v in x], [float(v) for v in links]
    y, acc = [0.0] * len(x), 0.0
    order = range(len(x) - 1, -1, -1) if right else range(len(x))
    for i, t in enumerate(order):
        link = 0.0 if i == 0 else links[t] if right else links[t - 1]
        acc = x[t] + link * acc
        y[t] = acc
    return np.array(y)


def reference(x, gamma, dones, axis, right):
    """The sum along ``axis`` with ``gamma`` already broadcast to ``x``'s shape."""
    links = gamma * (1.0 - (np.zeros(x.shape) if dones is None else dones != 0))
    xt, lt = np.moveaxis(x, axis, -1), np.moveaxis(links, axis, -1)
    y = np.empty(xt.shape)
    for row in np.ndindex(xt.shape[:-1]):
        y[row] = reference_row(xt[row], lt[row], right)
    return np.moveaxis(y, -1, axis)


def reference_n_step(rewards, dones, gamma, n):
    length = len(rewards)
    returns, discounts, steps = np.zeros(length), np.zeros(length), np.zeros(length, np.int64)
    for t in range(length):
        total, m = 0.0, 0
        while m < n and t + m < length:
            total += gamma**m * float(rewards[t + m])
            m += 1
            if dones[t + m - 1]:
                break
        returns[t], discounts[t], steps[t] = total, gamma**m, m
    return returns, discounts, steps


def reference_gae(rewards, values, dones, gamma, lam):
    advantages, last = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        alive = 1.0 - float(dones[t])
        delta = float(rewards[t]) + gamma * alive * float(values[t + 1]) - float(values[t])
        last = delta + gamma * lam * alive * last
        advantages[t] = last
    return advantages


def assert_within_one_rounding(result, exact):
    """float64: agree to float64 accuracy; float32: at most one float32 ulp from the exact value."""
    if result.dtype == np.float64:
        np.testing.assert_allclose(result, exact, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(exact).max(initial=0)))
    else:
        ulp = np.spacing(np.maximum(np.abs(exact), np.abs(result)).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(result.astype(np.float64) - exact) <= ulp)


# --- discounted sums ----------------------------------------------------------------------------


@st.composite
def problems(draw):
    """Random shape, axis, dtype, discount form and episode ends.

    Lengths reach past 128 steps for few rows (the chunked kernel) and past
    16 rows for short rows (row blocks with a remainder).
    """
    two_d = draw(st.booleans())
    rows = draw(st.integers(1, 20)) if two_d else 1
    steps = draw(st.integers(0, 40) | st.integers(120, 2600)) if rows < 8 else draw(st.integers(0, 60))
    axis = draw(st.sampled_from([0, 1, -1, -2])) if two_d else draw(st.sampled_from([0, -1]))
    shape = ((rows, steps) if axis in (1, -1) else (steps, rows)) if two_d else (steps,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape).astype(draw(st.sampled_from([np.float32, np.float64])))
    form = draw(st.sampled_from(["scalar", "full", "time"] + (["per-row"] if two_d else [])))
    time_shape, row_shape = [1] * len(shape), list(shape)
    time_shape[axis], row_shape[axis] = steps, 1
    gamma = {
        "scalar": float(rng.uniform(0.8, 1.0)),
        "full": rng.uniform(0.0, 1.0, shape),
        "time": rng.uniform(0.5, 1.0, steps),
        "per-row": rng.uniform(0.5, 1.0, row_shape),
    }[form]
    full_gamma = np.broadcast_to(np.reshape(gamma, time_shape) if form == "time" else gamma, shape)
    dones = (rng.random(shape) < draw(st.sampled_from([0.0, 0.05, 0.5]))) if draw(st.booleans()) else None
    return x, gamma, full_gamma, dones, axis


@pytest.mark.parametrize("direction", DIRECTIONS)
@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_sum_matches_float64_reference(direction, problem):
    x, gamma, full_gamma, dones, axis = problem
    result = DIRECTIONS[direction](x, gamma, dones=dones, axis=axis)
    assert result.dtype == x.dtype and result.shape == x.shape
    assert_within_one_rounding(result, reference(x.astype(np.float64), full_gamma, dones, axis, direction == "right"))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_input_is_not_modified(direction):
    rng = np.random.default_rng(1)
    x, gamma, dones = rng.standard_normal((3, 3000)), rng.uniform(0, 1, (3, 3000)), rng.random((3, 3000)) < 0.1
    copies = [a.copy() for a in (x, gamma, dones)]
    DIRECTIONS[direction](x, gamma, dones=dones)
    for before, after in zip(copies, (x, gamma, dones), strict=True):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("view", ["reversed", "every third step", "transposed", "read-only"])
def test_strided_and_read_only_views_give_the_same_sums_as_copies(direction, view):
    base = np.random.default_rng(15).standard_normal((9, 3000)).astype(np.float32)
    x = {
        "reversed": base[::-1, ::-1],
        "every third step": base[::2, ::3],
        "transposed": base.T,
        "read-only": np.lib.stride_tricks.as_strided(base, writeable=False),
    }[view]
    axis = 0 if view == "transposed" else 1
    dones = np.random.default_rng(16).random(x.shape) < 0.01
    result = DIRECTIONS[direction](x, 0.99, dones=dones, axis=axis)
    np.testing.assert_array_equal(result, DIRECTIONS[direction](np.ascontiguousarray(x), 0.99, dones=dones, axis=axis))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_out_receives_the_result_and_is_returned(direction):
    x = np.random.default_rng(2).standard_normal((4, 50)).astype(np.float32)
    out = np.full_like(x, np.nan)
    assert DIRECTIONS[direction](x, 0.9, out=out) is out
    np.testing.assert_array_equal(out, DIRECTIONS[direction](x, 0.9))


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("shape", [(5000,), (6, 300), (300, 6)])
def test_out_may_be_the_input_itself(direction, shape):
    x = np.random.default_rng(3).standard_normal(shape)
    expected = DIRECTIONS[direction](x, 0.97)
    DIRECTIONS[direction](x, 0.97, out=x)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_out_overlapping_the_input_gives_the_same_result(direction):
    buffer = np.random.default_rng(4).standard_normal(101)
    expected = DIRECTIONS[direction](buffer[:-1], 0.9)
    DIRECTIONS[direction](buffer[:-1], 0.9, out=buffer[1:])
    np.testing.assert_array_equal(buffer[1:], expected)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("into", ["fresh", "gamma", "dones"])
def test_out_with_a_discount_and_a_done_per_step_gives_the_same_result(direction, into):
    # out may be any float array of x's shape, also one the discounts or the dones were read from.
    rng = np.random.default_rng(15)
    x, gamma, flags = rng.standard_normal(50), rng.uniform(0.5, 1, 50), (rng.random(50) < 0.1).astype(np.float64)
    expected = DIRECTIONS[direction](x, gamma, dones=flags.astype(bool))
    out = {"fresh": np.empty_like(x), "gamma": gamma, "dones": flags}[into]
    DIRECTIONS[direction](x, gamma, dones=flags, out=out)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_with_per_step_gamma_and_resets_match_reference(direction, dtype):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 6000)).astype(dtype)
    gamma, dones = rng.uniform(0.9, 1, (2, 6000)), rng.random((2, 6000)) < 0.001
    result = DIRECTIONS[direction](x, gamma, dones=dones)
    assert_within_one_rounding(result, reference(x.astype(np.float64), gamma, dones, 1, direction == "right"))


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind, bound", [("ones", 5e-6), ("normal", 2e-6)])
def test_float32_precision_on_ten_thousand_steps(direction, kind, bound):
    rng = np.random.default_rng(5)
    x = (np.ones(10_000) if kind == "ones" else rng.standard_normal(10_000)).astype(np.float32)
    exact = reference(x.astype(np.float64), np.full(x.shape, 0.99), None, 0, direction == "right")
    assert np.abs(DIRECTIONS[direction](x, 0.99).astype(np.float64) - exact).max() <= bound


def test_left_sum_is_the_transpose_of_the_right_sum():
    rng = np.random.default_rng(6)
    x, z = rng.standard_normal((2, 3, 700))
    gamma, dones = rng.uniform(0, 1, (3, 700)), rng.random((3, 700)) < 0.05
    lhs = np.sum(discounted_cumsum_left(x, gamma, dones=dones) * z)
    rhs = np.sum(x * discounted_cumsum_right(z, gamma, dones=dones))
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_a_done_stops_the_future_from_flowing_back():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    dones = np.array([0, 1, 0, 0])
    np.testing.assert_array_equal(discounted_cumsum_right(x, 0.5, dones=dones), [2.0, 2.0, 8.0, 8.0])
    np.testing.assert_array_equal(discounted_cumsum_left(x, 0.5, dones=dones), [1.0, 2.5, 4.0, 10.0])


def test_gamma_one_is_a_plain_cumulative_sum():
    x = np.arange(1.0, 6.0)
    np.testing.assert_array_equal(discounted_cumsum_left(x, 1.0), np.cumsum(x))
    np.testing.assert_array_equal(discounted_cumsum_right(x, 1.0), np.cumsum(x[::-1])[::-1])


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0)])
def test_empty_input_gives_empty_output(shape):
    assert discounted_cumsum_right(np.zeros(shape, np.float32), 0.9).shape == shape


@pytest.mark.parametrize("gamma", [np.nan, np.inf, -0.1, 1.5, [0.5, np.nan, 0.5]])
def test_gamma_must_be_finite_and_in_unit_interval(gamma):
    with pytest.raises(ValueError, match=r"^gamma: "):
        discounted_cumsum_right(np.ones(3), gamma)


def test_a_discount_per_step_may_be_zero_or_one():
    x = np.arange(1.0, 5.0)
    np.testing.assert_array_equal(discounted_cumsum_right(x, [1.0, 0.0, 1.0, 1.0]), [3.0, 2.0, 7.0, 4.0])


@pytest.mark.parametrize("gamma", [[0.5, 1.5, 0.5], [0.5, -0.1, 0.5]], ids=["above-one", "negative"])
def test_a_discount_per_step_outside_zero_to_one_is_rejected(gamma):
    with pytest.raises(ValueError, match=r"^gamma: expected every discount to be finite and in \[0, 1\]"):
        discounted_cumsum_right(np.ones(3), gamma)


@pytest.mark.parametrize(
    "call",
    [
        lambda ints: n_step_returns(ints, None, 0.9, 2),
        lambda ints: gae(ints, np.ones(4), None, 0.9, 0.9),
    ],
    ids=["n_step_returns", "gae"],
)
def test_rewards_that_are_not_floats_are_rejected_by_name(call):
    with pytest.raises(TypeError, match=r"^rewards: expected a float32 or float64 array, got dtype int64"):
        call(np.ones(3, np.int64))


def test_a_discount_in_a_zero_dimensional_array_is_checked_as_a_number():
    with pytest.raises(ValueError, match=r"^gamma: expected a finite number in \[0, 1\], got 1.5"):
        discounted_cumsum_right(np.ones(3), np.array(1.5))


@pytest.mark.parametrize("gamma", [np.full(3, 0.5, np.float16), np.array(["a", "b", "c"])], ids=["float16", "strings"])
def test_discounts_of_another_dtype_are_rejected(gamma):
    with pytest.raises(TypeError, match=r"^gamma: expected real numbers in \[0, 1\], got dtype"):
        discounted_cumsum_right(np.ones(3), gamma)


def test_gamma_of_unbroadcastable_shape_is_rejected():
    with pytest.raises(ValueError, match=r"^gamma: "):
        discounted_cumsum_right(np.ones((2, 3)), np.full(4, 0.5))


def test_dones_of_another_shape_are_rejected():
    with pytest.raises(ValueError, match=r"^dones: "):
        discounted_cumsum_left(np.ones((2, 3)), 0.9, dones=np.zeros(3))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, bool, np.complex128])
def test_non_float_input_is_rejected(dtype):
    with pytest.raises(TypeError, match=r"^x: "):
        discounted_cumsum_right(np.ones(3, dtype), 0.9)


@pytest.mark.parametrize("shape, axis", [((3,), 1), ((3,), -2), ((2, 3), 2), ((2, 3), 0.5)])
def test_bad_axis_is_rejected(shape, axis):
    with pytest.raises(ValueError, match=r"^axis "):
        discounted_cumsum_right(np.ones(shape), 0.9, axis=axis)


def test_three_dimensional_input_is_rejected():
    with pytest.raises(ValueError, match=r"^x: "):
        discounted_cumsum_right(np.ones((2, 2, 2)), 0.9)


@pytest.mark.parametrize("out", [np.empty(3, np.float32), np.empty(4), np.empty(3)[::-1].copy().reshape(3, 1)])
def test_out_of_wrong_dtype_or_shape_is_rejected(out):
    with pytest.raises(ValueError, match=r"^out: "):
        discounted_cumsum_right(np.ones(3), 0.9, out=out)


# --- n-step returns -----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(0, 80),
    n=st.integers(1, 6),
    gamma=st.floats(0.0, 1.0),
    done_rate=st.sampled_from([0.0, 0.1, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_n_step_returns_match_reference(steps, n, gamma, done_rate, dtype, seed):
    rng = np.random.default_rng(seed)
    rewards, dones = rng.standard_normal(steps).astype(dtype), rng.random(steps) < done_rate
    result = n_step_returns(rewards, dones, gamma, n)
    returns, discounts, counts = reference_n_step(rewards, dones, gamma, n)
    assert result.returns.dtype == dtype and result.discounts.dtype == dtype
    assert_within_one_rounding(result.returns, returns)
    assert_within_one_rounding(result.discounts, discounts)
    np.testing.assert_array_equal(result.steps, counts)


def test_n_step_returns_fold_each_row_along_the_time_axis():
    rng = np.random.default_rng(7)
    rewards, dones = rng.standard_normal((30, 3)), rng.random((30, 3)) < 0.2
    result = n_step_returns(rewards, dones, 0.9, 4, axis=0)
    for column in range(3):
        want = reference_n_step(rewards[:, column], dones[:, column], 0.9, 4)[0]
        np.testing.assert_allclose(result.returns[:, column], want)


def test_n_step_returns_without_dones_stop_only_at_the_array_end():
    result = n_step_returns(np.ones(5), None, 0.5, 3)
    np.testing.assert_array_equal(result.steps, [3, 3, 3, 2, 1])
    np.testing.assert_array_equal(result.returns, [1.75, 1.75, 1.75, 1.5, 1.0])


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_n_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match=r"^n: "):
        n_step_returns(np.ones(3), None, 0.9, n)


# --- GAE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gae_matches_reference(dtype):
    rng = np.random.default_rng(8)
    rewards, values = rng.standard_normal(500).astype(dtype), rng.standard_normal(501).astype(dtype)
    dones = rng.random(500) < 0.05
    result = gae(rewards, values, dones, 0.99, 0.95)
    assert result.dtype == dtype
    assert_within_one_rounding(result, reference_gae(rewards, values, dones, 0.99, 0.95))


def test_gae_runs_along_the_given_axis():
    rng = np.random.default_rng(9)
    rewards, values, dones = rng.standard_normal((40, 2)), rng.standard_normal((41, 2)), rng.random((40, 2)) < 0.1
    result = gae(rewards, values, dones, 0.9, 0.8, axis=0)
    for column in range(2):
        np.testing.assert_allclose(
            result[:, column], reference_gae(rewards[:, column], values[:, column], dones[:, column], 0.9, 0.8)
        )


def test_gae_without_dones_is_gae_with_no_episode_end():
    rng = np.random.default_rng(10)
    rewards, values = rng.standard_normal(30), rng.standard_normal(31)
    np.testing.assert_array_equal(
        gae(rewards, values, None, 0.9, 0.8), gae(rewards, values, np.zeros(30, bool), 0.9, 0.8)
    )


@pytest.mark.parametrize("rewards, values", [(np.float32, np.float64), (np.float64, np.float32)])
def test_gae_returns_the_wider_of_the_rewards_and_values_dtypes(rewards, values):
    assert gae(np.ones(4, rewards), np.ones(5, values), None, 0.9, 0.9).dtype == np.float64


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: n_step_returns(np.ones(3), None, 1.5, 2), "gamma"),
        (lambda: n_step_returns(np.ones(3), None, 0.9, 2, axis=1), "axis"),
        (lambda: gae(np.ones(3), np.ones(4), None, 1.5, 0.9), "gamma"),
        (lambda: gae(np.ones(3), np.ones(4, np.int64), None, 0.9, 0.9), "values"),
        (lambda: gae(np.ones(3), np.ones(4), None, 0.9, 0.9, axis=1), "axis"),
    ],
    ids=["n-step-gamma", "n-step-axis", "gae-gamma", "gae-values", "gae-axis"],
)
def test_n_step_and_gae_refusals_name_the_argument(call, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        call()


def test_gae_needs_one_bootstrap_value_more_than_rewards():
    with pytest.raises(ValueError, match=r"^values: "):
        gae(np.ones(4), np.ones(4), None, 0.9, 0.9)


@pytest.mark.parametrize("lam", [-0.5, 2.0, np.nan])
def test_gae_lambda_must_be_in_unit_interval(lam):
    with pytest.raises(ValueError, match=r"^lam: "):
        gae(np.ones(4), np.ones(5), None, 0.9, lam)


# --- torch --------------------------------------------------------------------------------------


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("gamma_form", ["scalar", "time", "full"])
def test_tensor_sums_pass_gradcheck(torch, direction, axis, gamma_form):
    gen = torch.Generator().manual_seed(10)
    shape = (3, 9) if axis == 1 else (9, 3)
    x = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    gamma_shape = {"scalar": (), "time": (9,), "full": shape}[gamma_form]
    gamma = (0.3 + 0.6 * torch.rand(gamma_shape, dtype=torch.float64, generator=gen)).requires_grad_()
    dones = torch.rand(shape, generator=gen) < 0.2
    function = DIRECTIONS[direction]
    assert torch.autograd.gradcheck(lambda a, g: function(a, g, dones=dones, axis=axis), (x, gamma))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_tensor_sums_equal_the_array_sums(torch, direction):
    x = np.random.default_rng(11).standard_normal((2, 3000)).astype(np.float32)
    result = DIRECTIONS[direction](torch.from_numpy(x), 0.99)
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    np.testing.assert_array_equal(result.numpy(), DIRECTIONS[direction](x, 0.99))


def test_tensors_refuse_out(torch):
    with pytest.raises(TypeError, match=r"^out: "):
        discounted_cumsum_right(torch.ones(3), 0.9, out=np.empty(3, np.float32))


def test_tensor_n_step_returns_match_arrays_and_pass_gradcheck(torch):
    rng = np.random.default_rng(12)
    rewards, dones = rng.standard_normal(25), rng.random(25) < 0.2
    tensor = torch.from_numpy(rewards).requires_grad_()
    result = n_step_returns(tensor, torch.from_numpy(dones), 0.9, 3)
    np.testing.assert_allclose(result.returns.detach().numpy(), n_step_returns(rewards, dones, 0.9, 3).returns)
    assert torch.autograd.gradcheck(lambda r: n_step_returns(r, dones, 0.9, 3).returns, (tensor,))


def test_tensor_gae_matches_arrays_and_passes_gradcheck(torch):
    rng = np.random.default_rng(13)
    rewards, values, dones = rng.standard_normal((2, 20)), rng.standard_normal((2, 21)), rng.random((2, 20)) < 0.2
    r, v = torch.from_numpy(rewards).requires_grad_(), torch.from_numpy(values).requires_grad_()
    np.testing.assert_allclose(gae(r, v, dones, 0.9, 0.8).detach().numpy(), gae(rewards, values, dones, 0.9, 0.8))
    assert torch.autograd.gradcheck(lambda a, b: gae(a, b, dones, 0.9, 0.8), (r, v))


# --- benchmark ----------------------------------------------------------------------------------


def test_benchmark_quick_run_prints_every_table(capsys, monkeypatch):
    from mpreplay.bench import returns as bench

    monkeypatch.setitem(sys.modules, "numba", None)  # its loops would compile for seconds: run as without numba
    assert bench.main(["--quick", "--repeat", "1"]) == 0
    printed = capsys.readouterr().out
    for title in ("discounted cumulative sum", "float32 precision", "n-step folding"):
        assert title in printed
