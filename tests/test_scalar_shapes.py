"""A scalar field's shape in samples (docs/cpprb.md): declared ``{}`` it is ``(B,)`` natively, as
``{"shape": 1}`` it is cpprb's ``(B, 1)``, from every class, through ``sample`` and ``batches()``
alike, and ``add`` takes a plain number per transition either way."""

from __future__ import annotations

import numpy as np
import pytest

import mpreplay

pytestmark = pytest.mark.timeout(60, method="thread")

TRANSITION_CLASSES = [
    mpreplay.ReplayBuffer,
    mpreplay.PrioritizedReplayBuffer,
    mpreplay.MPReplayBuffer,
    mpreplay.MPPrioritizedReplayBuffer,
]
SEQUENCE_CLASSES = [
    mpreplay.SequenceReplayBuffer,
    mpreplay.PrioritizedSequenceReplayBuffer,
    mpreplay.MPSequenceReplayBuffer,
    mpreplay.MPPrioritizedSequenceReplayBuffer,
]
LENGTH = 3  # a sequence table's sequences


def filled(cls: type, rew: dict[str, object]) -> mpreplay.Table:
    """A table of class ``cls`` whose ``rew`` field is declared ``rew``, 8 steps added one a call,
    each ``rew`` a Python float."""
    fields = {"obs": {"shape": (2,)}, "rew": rew, "done": {}}
    options = {"length": LENGTH} if cls in SEQUENCE_CLASSES else {}
    table = cls(32, fields, **options)
    for step in range(8):
        table.add(obs=np.full(2, step), rew=float(step), done=0.0)
    return table


def sampled_rew_shapes(table: mpreplay.Table) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of ``rew`` in a sample of 4, and in a batch of 4 from ``batches()``."""
    by_sample = table.sample(4)["rew"].shape
    with table.batches(4, timeout=10) as batches:
        by_batches = next(batches)["rew"].shape
    return by_sample, by_batches


@pytest.mark.parametrize("cls", TRANSITION_CLASSES + SEQUENCE_CLASSES, ids=lambda cls: cls.__name__)
def test_a_field_declared_with_no_shape_samples_one_value_per_item(cls):
    with filled(cls, {}) as table:
        batch = (4, LENGTH) if cls in SEQUENCE_CLASSES else (4,)
        assert sampled_rew_shapes(table) == (batch, batch)


@pytest.mark.parametrize("cls", TRANSITION_CLASSES + SEQUENCE_CLASSES, ids=lambda cls: cls.__name__)
def test_a_field_declared_with_shape_1_samples_cpprbs_column(cls):
    with filled(cls, {"shape": 1}) as table:
        batch = (4, LENGTH, 1) if cls in SEQUENCE_CLASSES else (4, 1)
        assert sampled_rew_shapes(table) == (batch, batch)


@pytest.mark.parametrize("cls", TRANSITION_CLASSES, ids=lambda cls: cls.__name__)
def test_the_values_are_the_same_whichever_the_declaration(cls):
    with filled(cls, {}) as scalar, filled(cls, {"shape": 1}) as column:
        np.testing.assert_array_equal(scalar.get_all_transitions()["rew"], column.get_all_transitions()["rew"][:, 0])
