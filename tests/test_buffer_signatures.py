"""The named buffer classes' constructors: every parameter listed (no ``**options``), the table's
own ones exactly as ``Table`` takes them, and a misspelt one refused naming the class called."""

from __future__ import annotations

import inspect

import pytest

import mpreplay
from mpreplay import Table

NAMED = [getattr(mpreplay, name) for name in mpreplay.buffers.__all__]
# What a class decides instead of its caller: shared memory or not (the MP twins), and a sequence
# class's SequenceSpec, built from its own length, period, pad_end and eta.
DECIDED = {"shared"}
SEQUENCE_OWN = ["length", "period", "pad_end", "eta"]
PRIORITIZED_OWN = ["alpha", "eps", "new_priority"]


def parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(list(inspect.signature(cls.__init__).parameters.items())[1:])


def own_parameters(cls: type) -> list[str]:
    sequence = "Sequence" in cls.__name__
    prioritized = "Prioritized" in cls.__name__
    return (SEQUENCE_OWN if sequence else []) + (PRIORITIZED_OWN if prioritized else [])


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_a_named_class_takes_no_catch_all_keywords(cls):
    kinds = {p.kind for p in parameters(cls).values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_a_named_class_lists_the_tables_parameters_as_the_table_takes_them(cls):
    table = parameters(Table)
    decided = DECIDED | ({"sequence"} if "Sequence" in cls.__name__ else set())
    own = own_parameters(cls)
    mine = parameters(cls)
    assert [name for name in mine if name not in own] == [name for name in table if name not in decided]
    for name in set(mine) - set(own):
        assert (mine[name].kind, mine[name].default, mine[name].annotation) == (
            table[name].kind,
            table[name].default,
            table[name].annotation,
        ), name


def test_the_sequence_and_prioritized_parameters_agree_between_the_classes():
    combined = parameters(mpreplay.PrioritizedSequenceReplayBuffer)
    for cls, names in (
        (mpreplay.SequenceReplayBuffer, SEQUENCE_OWN),
        (mpreplay.PrioritizedReplayBuffer, PRIORITIZED_OWN),
    ):
        for name in names:
            assert parameters(cls)[name] == combined[name], name


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_a_misspelt_keyword_is_refused_naming_the_class_called(cls):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}.__init__\(\) got an unexpected keyword argument 'sead'"):
        cls(16, {"obs": {}}, length=2, sead=0) if "Sequence" in cls.__name__ else cls(16, {"obs": {}}, sead=0)
