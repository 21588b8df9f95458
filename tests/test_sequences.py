"""Specification of mpreplay.sequences: cutting episodes into sequences, their steps, their priorities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpreplay.sequences import SequenceCutter, sequence_priority


def cut_episode(cutter: SequenceCutter, steps: int) -> list[tuple[int, int]]:
    """Every (offset, valid) the cutter announces for one episode stored step by step."""
    found = []
    for _ in range(steps):
        offsets, valid = cutter.add(1)
        found += zip(offsets.tolist(), valid.tolist(), strict=True)
    offsets, valid = cutter.end_episode()
    return found + list(zip(offsets.tolist(), valid.tolist(), strict=True))


# -- SequenceCutter ---------------------------------------------------------------------------------
def test_full_sequences_start_every_period_and_overlap_by_length_minus_period():
    assert cut_episode(SequenceCutter(80, 40, pad_end=False), 200) == [(0, 80), (40, 80), (80, 80), (120, 80)]


def test_a_sequence_is_announced_when_its_last_step_is_stored_and_not_before():
    cutter = SequenceCutter(4, 2)
    assert cutter.add(3)[0].tolist() == []
    assert cutter.add(1)[0].tolist() == [0]
    assert cutter.add(1)[0].tolist() == []
    assert cutter.add(1)[0].tolist() == [2]


def test_adding_steps_in_one_batch_announces_what_adding_them_one_by_one_does():
    offsets, valid = SequenceCutter(5, 2).add(12)
    cut = cut_episode(SequenceCutter(5, 2, pad_end=False), 12)
    assert list(zip(offsets.tolist(), valid.tolist(), strict=True)) == cut


def test_the_padded_final_sequence_keeps_the_steps_no_full_sequence_covers():
    # 0..79 and 40..119 are full; steps 120..129 are covered only by a padded sequence from 80
    assert cut_episode(SequenceCutter(80, 40), 130)[-1] == (80, 50)


def test_no_padded_sequence_when_the_full_ones_cover_the_episode():
    assert cut_episode(SequenceCutter(80, 40), 120) == [(0, 80), (40, 80)]


def test_an_episode_shorter_than_a_sequence_is_one_padded_sequence():
    assert cut_episode(SequenceCutter(80, 40), 7) == [(0, 7)]


def test_without_padding_an_episode_shorter_than_a_sequence_has_none():
    assert cut_episode(SequenceCutter(80, 40, pad_end=False), 79) == []


def test_an_empty_episode_has_no_sequence():
    assert cut_episode(SequenceCutter(4, 2), 0) == []


def test_sequences_never_cross_into_the_next_episode():
    cutter = SequenceCutter(4, 2)
    cutter.add(3)
    assert cutter.end_episode()[0].tolist() == [0]
    offsets, _ = cutter.add(3)
    assert offsets.tolist() == [] and cutter.stored == 3  # 3 steps of the new episode: no full sequence yet
    assert cutter.add(1)[0].tolist() == [0]


@settings(max_examples=300, deadline=None)
@given(steps=st.integers(0, 60), length=st.integers(1, 12), period=st.integers(1, 12))
def test_with_padding_every_step_lies_in_a_sequence_within_the_episode(steps, length, period):
    period = min(period, length)  # longer periods skip steps by design
    covered = np.zeros(steps, dtype=bool)
    for offset, valid in cut_episode(SequenceCutter(length, period), steps):
        assert offset >= 0 and offset + valid <= steps and 1 <= valid <= length
        covered[offset : offset + valid] = True
    assert covered.all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(length=0, period=1), "length: expected an integer >= 1, got 0"),
        (dict(length=4, period=0), "period: expected an integer >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequenceCutter(**kwargs)


def test_pad_end_must_be_a_bool():
    with pytest.raises(TypeError, match="pad_end: expected a bool, got 1"):
        SequenceCutter(4, 2, pad_end=1)


def test_an_episode_kept_from_a_later_step_on_starts_its_sequences_where_they_started():
    cutter = SequenceCutter(4, 2, first=3)
    offsets, steps = cutter.add(5)
    assert offsets.tolist() == [4] and steps.tolist() == [4]


def test_a_negative_step_count_is_refused_and_changes_nothing():
    cutter = SequenceCutter(4, 2)
    cutter.add(3)
    with pytest.raises(ValueError, match="steps: expected an integer >= 0, got -1"):
        cutter.add(-1)
    assert cutter.stored == 3 and cutter.add(1)[0].tolist() == [0]


# -- sequence_priority ------------------------------------------------------------------------------
def test_priority_is_eta_times_max_plus_the_rest_times_mean_of_absolute_td():
    p = sequence_priority([[1.0, -3.0, 2.0]], eta=0.9)
    assert p.tolist() == pytest.approx([0.9 * 3.0 + 0.1 * 2.0])


def test_masked_steps_count_neither_in_the_max_nor_in_the_mean():
    p = sequence_priority([[1.0, 3.0, -100.0]], [[True, True, False]], eta=0.5)
    assert p.tolist() == pytest.approx([0.5 * 3.0 + 0.5 * 2.0])


@pytest.mark.parametrize("eta, expected", [(1.0, 4.0), (0.0, 2.5)])
def test_eta_one_is_the_max_and_eta_zero_the_mean(eta, expected):
    assert sequence_priority([[1.0, -4.0, 2.0, 3.0]], eta=eta).tolist() == pytest.approx([expected])


def test_priority_takes_a_tensor():
    torch = pytest.importorskip("torch")
    td = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert sequence_priority(td, mask).tolist() == pytest.approx([0.9 * 1.0 + 0.1 * 0.75, 2.0])


def test_a_sequence_without_real_steps_is_refused():
    with pytest.raises(ValueError, match="mask: expected at least one True per sequence, row 1 has none"):
        sequence_priority([[1.0], [2.0]], [[True], [False]])


def test_a_mask_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"mask: expected shape \(1, 2\) \(that of td_errors\), got \(1, 3\)"):
        sequence_priority([[1.0, 2.0]], [[True, True, True]])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_td_errors_that_are_not_finite_are_refused(bad):
    with pytest.raises(ValueError, match=r"td_errors: expected finite numbers, got .* at \(0, 1\)"):
        sequence_priority([[1.0, bad]])


@pytest.mark.parametrize("eta", [-0.1, 1.5])
def test_eta_outside_zero_to_one_is_refused(eta):
    with pytest.raises(ValueError, match=r"eta: expected a finite number in \[0, 1\]"):
        sequence_priority([[1.0]], eta=eta)
