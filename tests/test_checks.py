"""Specification of mpreplay.checks: one meaning for every argument check."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from mpreplay import checks


# -- integer ----------------------------------------------------------------------------------------
def test_python_and_numpy_integers_are_integers():
    assert checks.integer("size", 3, low=1) == 3
    value = checks.integer("size", np.int32(3), low=1)
    assert value == 3 and type(value) is int


@pytest.mark.parametrize("make", [int, np.int64, np.uint8], ids=["int", "int64", "uint8"])
def test_an_integer_at_either_bound_is_accepted_whatever_its_type(make):
    assert checks.integer("max_times_sampled", make(1), low=1) == 1
    assert checks.integer("rank", make(3), low=1, high=3) == 3


@pytest.mark.parametrize("make", [int, np.int64], ids=["int", "int64"])
def test_an_integer_just_past_either_bound_is_refused_whatever_its_type(make):
    with pytest.raises(ValueError, match="max_times_sampled: expected an integer >= 1, got"):
        checks.integer("max_times_sampled", make(0), low=1)
    with pytest.raises(ValueError, match=r"rank: expected an integer in \[1, 3\], got"):
        checks.integer("rank", make(4), low=1, high=3)


def test_a_bool_is_not_an_integer():
    with pytest.raises(ValueError, match="size: expected an integer >= 1, got True"):
        checks.integer("size", True, low=1)


def test_an_integral_float_is_not_an_integer():
    with pytest.raises(ValueError, match=r"size: expected an integer >= 1, got 4\.0"):
        checks.integer("size", 4.0, low=1)


def test_an_integer_below_low_is_refused():
    with pytest.raises(ValueError, match="prefetch: expected an integer >= 0, got -1"):
        checks.integer("prefetch", -1, low=0)


def test_an_integers_bounds_are_both_included():
    assert checks.integer("rank", 0, low=0, high=3) == 0
    assert checks.integer("rank", 3, low=0, high=3) == 3
    with pytest.raises(ValueError, match=r"rank: expected an integer in \[0, 3\], got 4"):
        checks.integer("rank", 4, low=0, high=3)


def test_a_string_is_not_an_integer():
    with pytest.raises(ValueError, match="size: expected an integer >= 1, got '4'"):
        checks.integer("size", "4", low=1)


# -- number -----------------------------------------------------------------------------------------
def test_python_and_numpy_numbers_and_0d_arrays_are_numbers():
    assert checks.number("beta", 1, low=0.0) == 1.0
    assert checks.number("beta", np.float32(0.5), low=0.0) == 0.5
    assert checks.number("beta", np.array(0.25), low=0.0) == 0.25


@pytest.mark.parametrize("make", [int, np.float32, np.array], ids=["int", "float32", "0-d array"])
def test_a_number_at_either_bound_is_accepted_whatever_its_type(make):
    assert checks.number("eps", make(0), low=0.0) == 0.0
    assert checks.number("gamma", make(1), low=0.0, high=1.0) == 1.0


def test_a_number_above_an_upper_bound_alone_says_so():
    with pytest.raises(ValueError, match=r"^eta: expected a finite number <= 1, got 2"):
        checks.number("eta", 2, high=1.0)


def test_an_array_of_one_number_is_not_a_number():
    with pytest.raises(TypeError, match=r"beta: expected a number, got array\(\[0\.5\]\)"):
        checks.number("beta", np.array([0.5]), low=0.0)


def test_a_bool_is_not_a_number():
    with pytest.raises(TypeError, match="beta: expected a number, got True"):
        checks.number("beta", True, low=0.0)


def test_a_numeric_string_is_not_a_number():
    with pytest.raises(TypeError, match=r"beta: expected a number, got '0\.5'"):
        checks.number("beta", "0.5", low=0.0)


def test_nan_is_out_of_every_range():
    with pytest.raises(ValueError, match="gamma: expected a finite number in"):
        checks.number("gamma", math.nan, low=0.0, high=1.0)
    with pytest.raises(ValueError, match="min_diff: expected a number, got nan"):
        checks.number("min_diff", math.nan, finite=False)


def test_a_number_is_finite_unless_infinities_are_allowed():
    with pytest.raises(ValueError, match="beta: expected a finite number >= 0, got inf"):
        checks.number("beta", math.inf, low=0.0)
    assert checks.number("max_diff", math.inf, finite=False) == math.inf


def test_open_bounds_exclude_their_end():
    assert checks.number("samples_per_insert", 1e-9, low=0.0, low_open=True) == 1e-9
    with pytest.raises(ValueError, match="samples_per_insert: expected a finite number > 0, got 0"):
        checks.number("samples_per_insert", 0, low=0.0, low_open=True)
    with pytest.raises(ValueError, match=r"x: expected a finite number in \[0, 1\), got 1.0"):
        checks.number("x", 1.0, low=0.0, high=1.0, high_open=True)


# -- seconds ----------------------------------------------------------------------------------------
def test_timeout_none_means_no_limit():
    assert checks.seconds("timeout", None) is None


def test_timeout_0_means_do_not_wait():
    assert checks.seconds("timeout", 0) == 0.0


def test_none_is_refused_where_a_time_is_required():
    with pytest.raises(TypeError, match="grace: expected a finite number of seconds >= 0, got None"):
        checks.seconds("grace", None, allow_none=False)


def test_a_negative_number_of_seconds_is_refused():
    with pytest.raises(ValueError, match=r"timeout: expected None \(no limit\) or a finite number of seconds >= 0"):
        checks.seconds("timeout", -1)


def test_nan_is_not_a_number_of_seconds():
    with pytest.raises(ValueError, match="timeout: expected"):
        checks.seconds("timeout", math.nan)


def test_an_infinite_number_of_seconds_is_refused_none_says_no_limit():
    with pytest.raises(ValueError, match="timeout: expected None"):
        checks.seconds("timeout", math.inf)


def test_a_bool_is_not_a_number_of_seconds():
    with pytest.raises(TypeError, match="timeout: expected"):
        checks.seconds("timeout", True)


# -- choice and dtype -------------------------------------------------------------------------------
def test_a_choice_is_one_of_its_options():
    assert checks.choice("new_priority", "max_ever", ("max_stored", "max_ever")) == "max_ever"


@pytest.mark.parametrize("value", ["newest", 1], ids=["other-string", "not-a-string"])
def test_anything_else_is_refused_naming_the_options(value):
    with pytest.raises(ValueError, match=r"^new_priority: expected one of 'max_stored', 'max_ever', got "):
        checks.choice("new_priority", value, ("max_stored", "max_ever"))


def test_a_dtype_is_one_of_its_options_in_any_spelling():
    assert checks.dtype("weights_dtype", "float32", (np.float64, np.float32)) == np.float32


@pytest.mark.parametrize("value", ["int8", "no such dtype"], ids=["other-dtype", "not-a-dtype"])
def test_another_dtype_is_refused_naming_the_options(value):
    with pytest.raises(ValueError, match=r"^weights_dtype: expected one of the dtypes float64, float32, got '"):
        checks.dtype("weights_dtype", value, (np.float64, np.float32))


# -- flag -------------------------------------------------------------------------------------------
def test_python_and_numpy_bools_are_flags_and_1_is_not():
    assert checks.flag("compress", np.True_) is True
    with pytest.raises(TypeError, match="compress: expected a bool, got 1"):
        checks.flag("compress", 1)


# -- indexes ----------------------------------------------------------------------------------------
def test_indexes_become_a_contiguous_1d_int64_array():
    idx = checks.indexes("indexes", np.arange(10, dtype=np.uint32)[::2])
    assert idx.dtype == np.int64 and idx.flags.c_contiguous and idx.tolist() == [0, 2, 4, 6, 8]
    assert checks.indexes("indexes", 7).tolist() == [7]
    assert checks.indexes("indexes", []).shape == (0,)


def test_an_int64_array_is_taken_as_it_is():
    idx = np.arange(4, dtype=np.int64)
    assert checks.indexes("indexes", idx) is idx


def test_uint64_indexes_are_taken_without_a_copy():
    idx = np.arange(4, dtype=np.uint64)
    got = checks.indexes("indexes", idx)
    assert got.dtype == np.int64 and np.shares_memory(got, idx) and got.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("idx", [np.arange(6, dtype=np.uint64)[::2], np.uint64(3)], ids=["strided", "scalar"])
def test_uint64_indexes_the_kernels_cannot_take_as_they_are_are_int64_too(idx):
    got = checks.indexes("indexes", idx)
    assert got.dtype == np.int64 and got.flags.c_contiguous and got.tolist() == np.atleast_1d(idx).tolist()


def test_a_uint64_index_of_2_to_the_63_or_more_reads_as_negative():
    assert checks.indexes("indexes", np.array([2**63, 1], dtype=np.uint64)).tolist() == [-(2**63), 1]


def test_whole_float_indexes_are_taken_as_integers():
    assert checks.indexes("indexes", [0.0, 3.0]).tolist() == [0, 3]


@pytest.mark.parametrize("bad", [0.5, math.nan, math.inf], ids=["fraction", "nan", "inf"])
def test_a_float_index_that_is_not_a_whole_number_is_refused(bad):
    with pytest.raises(ValueError, match=r"indexes: expected integers, got .* at position 1"):
        checks.indexes("indexes", [1.0, bad])


def test_non_numeric_indexes_are_refused():
    with pytest.raises(TypeError, match="indexes: expected integers, got dtype <U1"):
        checks.indexes("indexes", ["a"])


def test_unaligned_indexes_and_priorities_become_aligned_copies(unaligned):
    idx = checks.indexes("indexes", unaligned(np.array([3, 1])))
    p = checks.priorities("priorities", unaligned(np.array([0.5, 2.0])), 2, max_priority=10.0)
    assert idx.flags.aligned and idx.flags.c_contiguous and idx.tolist() == [3, 1]
    assert p.flags.aligned and p.flags.c_contiguous and p.tolist() == [0.5, 2.0]


def test_2d_indexes_are_refused():
    with pytest.raises(ValueError, match=r"indexes: expected a 1-D array, got shape \(1, 2\)"):
        checks.indexes("indexes", [[0, 1]])


def test_tensor_indexes_are_taken():
    torch = pytest.importorskip("torch")
    assert checks.indexes("indexes", torch.tensor([3, 1])).tolist() == [3, 1]


# -- priorities -------------------------------------------------------------------------------------
def test_priorities_become_count_contiguous_float64_values():
    p = checks.priorities("priorities", [1, 2], 2, max_priority=10.0)
    assert p.dtype == np.float64 and p.tolist() == [1.0, 2.0]
    assert checks.priorities("priorities", 0.5, 1, max_priority=10.0).tolist() == [0.5]


def test_one_priority_is_given_to_every_transition():
    assert checks.priorities("priorities", np.float32(0.5), 3, max_priority=10.0).tolist() == [0.5] * 3


def test_priorities_of_any_shape_with_one_per_transition_are_flattened():
    column = np.array([[1.0], [2.0]], dtype=np.float32)  # a loss of shape (B, 1)
    assert checks.priorities("priorities", column, 2, max_priority=10.0).tolist() == [1.0, 2.0]


def test_none_is_not_a_priority():
    with pytest.raises(TypeError, match="priorities: expected numbers, got None"):
        checks.priorities("priorities", None, 1, max_priority=10.0)


def test_priorities_must_number_one_per_transition():
    with pytest.raises(ValueError, match=r"priorities: expected 2 values \(one per transition\), got 1"):
        checks.priorities("priorities", [1.0], 2, max_priority=10.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 11.0], ids=["negative", "nan", "inf", "above-maximum"])
def test_a_priority_outside_0_to_the_maximum_is_refused(bad):
    with pytest.raises(ValueError, match=r"priorities: expected finite values in \[0, 10\], got .* at position 1"):
        checks.priorities("priorities", [1.0, bad], 2, max_priority=10.0)


def test_each_priority_may_have_its_own_maximum():
    limits = np.array([10.0, 1.0])
    assert checks.priorities("priorities", [5.0, 1.0], 2, max_priority=limits).tolist() == [5.0, 1.0]
    with pytest.raises(ValueError, match=r"expected finite values in \[0, 1\], got 5.0 at position 1"):
        checks.priorities("priorities", [1.0, 5.0], 2, max_priority=limits)


def test_without_a_maximum_the_range_is_left_to_the_ring():
    assert checks.priorities("priorities", [-1.0], 1, max_priority=None).tolist() == [-1.0]


def test_strings_are_not_priorities():
    with pytest.raises(TypeError, match="priorities: expected numbers, got str"):
        checks.priorities("priorities", "high", 1, max_priority=10.0)


def test_tensor_priorities_are_taken_even_with_a_gradient():
    torch = pytest.importorskip("torch")
    p = torch.tensor([0.5, 2.0], requires_grad=True) * 2
    assert checks.priorities("priorities", p, 2, max_priority=10.0).tolist() == [1.0, 4.0]


def test_a_priority_of_zero_is_in_range():
    assert checks.priorities("priorities", [0.0, 10.0], 2, max_priority=10.0).tolist() == [0.0, 10.0]


# -- tensors ----------------------------------------------------------------------------------------
def test_is_tensor_never_imports_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert not checks.is_tensor(np.zeros(2))
    assert "torch" not in sys.modules


def test_a_tensor_is_a_tensor_and_an_array_is_not():
    torch = pytest.importorskip("torch")
    assert checks.is_tensor(torch.zeros(2))
    assert not checks.is_tensor(np.zeros(2))


@pytest.mark.parametrize("value", [8, 8.0, 1e3, np.float32(8), np.int64(8)])
def test_capacity_takes_integers_and_integral_floats(value):
    assert checks.capacity("size", value) == int(value)
    assert type(checks.capacity("size", value)) is int


@pytest.mark.parametrize("value", [8.5, math.inf, math.nan, 0, 0.0, True, "8", None])
def test_capacity_refuses_anything_else_naming_the_argument(value):
    with pytest.raises(ValueError, match="size: expected an integer >= 1"):
        checks.capacity("size", value)


# -- matrix -----------------------------------------------------------------------------------------
def test_matrix_of_numbers_is_a_contiguous_float64_array():
    m = checks.matrix("td", [[1, 2], [3, 4]], kind="f")
    assert m.dtype == np.float64 and m.flags.c_contiguous and m.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_matrix_of_bools_keeps_bools():
    m = checks.matrix("mask", np.array([[True, False]]), kind="b")
    assert m.dtype == np.bool_ and m.tolist() == [[True, False]]


def test_matrix_of_bools_refuses_integers():
    with pytest.raises(TypeError, match="mask: expected bools, got dtype int64"):
        checks.matrix("mask", np.array([[1, 0]], dtype=np.int64), kind="b")


def test_matrix_of_numbers_refuses_bools():
    with pytest.raises(TypeError, match="td: expected numbers, got dtype bool"):
        checks.matrix("td", [[True]], kind="f")


def test_matrix_refuses_other_dimensions():
    with pytest.raises(ValueError, match=r"td: expected a 2-D array, got shape \(3,\)"):
        checks.matrix("td", [1.0, 2.0, 3.0], kind="f")


def test_matrix_of_numbers_refuses_nan_and_names_where():
    with pytest.raises(ValueError, match=r"td: expected finite numbers, got nan at \(1, 0\)"):
        checks.matrix("td", [[1.0], [math.nan]], kind="f")


@pytest.mark.parametrize("bad", [math.inf, -math.inf], ids=["inf", "-inf"])
def test_matrix_of_numbers_refuses_an_infinity_as_it_refuses_nan(bad):
    with pytest.raises(ValueError, match=rf"td: expected finite numbers, got {bad!r} at \(0, 1\)"):
        checks.matrix("td", [[1.0, bad]], kind="f")


def test_matrix_takes_a_tensor():
    torch = pytest.importorskip("torch")
    assert checks.matrix("td", torch.ones(2, 3), kind="f").shape == (2, 3)
