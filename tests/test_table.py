"""One table built from parts: every combination the docs call legal goes through the one
constructor, is written and sampled; every other is refused naming the argument."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mpreplay import (
    MinSize,
    MPPrioritizedSequenceReplayBuffer,
    PrioritizedReplayBuffer,
    Queue,
    ReplayBuffer,
    SequenceSpec,
    Stack,
    Table,
    buffers,
    removers,
    selectors,
)

FIELDS = {"obs": {"shape": (2, 3), "dtype": np.uint8}, "act": {"dtype": np.int64}, "done": {}}
STORAGE = {"plain": {}, "compressed": {"next_of": "obs", "stack_compress": "obs"}}
LIMITERS = {"none": None, "min_size": MinSize(4)}
SIZE = 64


def _legal(remover: str, storage: str) -> bool:
    # keep_unread without max_times_sampled is refused (nothing would ever free a slot).
    return removers.entry(remover).overwrites and (storage == "plain" or removers.entry(remover).frames)


COMBINATIONS = [
    pytest.param(sel, rem, lim, shared, storage, id=f"{sel}-{rem}-{lim}-{'shared' if shared else 'local'}-{storage}")
    for sel, rem, lim, shared, storage in itertools.product(
        selectors.names(), removers.names(), LIMITERS, (False, True), STORAGE
    )
    if _legal(rem, storage)
]


def _episode(table: Table, steps: int) -> None:
    """One episode of ``steps`` steps, ended; each stack's frames name their steps."""
    frames = np.arange(steps + 1, dtype=np.uint8)
    for t in range(steps):
        stack = np.stack([np.full(2, frames[max(0, t - 2 + j)]) for j in range(3)], axis=-1)
        row = {"obs": stack, "act": t, "done": float(t == steps - 1)}
        if "next_obs" in table.get_env_dict():
            nxt = np.stack([np.full(2, frames[max(0, t - 1 + j)]) for j in range(3)], axis=-1)
            row["next_obs"] = nxt
        table.add(**row, timeout=0)


@pytest.mark.parametrize(("selector", "remover", "limiter", "shared", "storage"), COMBINATIONS)
def test_every_legal_combination_is_built_written_sampled_and_verified(selector, remover, limiter, shared, storage):
    with Table(
        SIZE,
        FIELDS,
        selector=selector,
        remover=remover,
        rate_limiter=LIMITERS[limiter],
        shared=shared,
        **STORAGE[storage],
    ) as table:
        _episode(table, 20)
        batch = table.sample(8, timeout=0)
        assert batch["obs"].shape == (8, 2, 3) and ("weights" in batch) == table.config.by_priority
        if table.config.by_priority:
            table.update_priorities(batch["indexes"], np.linspace(0.5, 2.0, 8))
        assert table.verify()["complete"] == table.get_stored_size() > 0


@pytest.mark.parametrize("limiter", [Queue, Stack])
@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
@pytest.mark.parametrize("storage", sorted(STORAGE))
def test_a_queue_or_stack_is_built_from_any_storage_and_hands_each_item_out_once(limiter, shared, storage):
    with Table(SIZE, FIELDS, rate_limiter=limiter(SIZE), shared=shared, **STORAGE[storage]) as table:
        _episode(table, 20)
        stored = table.get_stored_size()
        taken = table.sample(stored, timeout=0)["act"].tolist()
        assert sorted(taken) == list(range(20)) and table.get_stored_size() == 0
        assert table.config.remover == "keep_unread" and table.config.max_times_sampled == 1


@pytest.mark.parametrize("remover", [n for n in removers.names() if not removers.entry(n).frames])
def test_a_remover_that_replaces_an_episodes_frames_is_refused_with_compression(remover):
    with pytest.raises(ValueError, match=f"remover: '{remover}'"):
        Table(SIZE, FIELDS, remover=remover, next_of="obs")


def test_a_remover_that_keeps_unread_items_is_refused_when_no_sample_retires_them():
    with pytest.raises(ValueError, match=r"remover: 'keep_unread' .* max_times_sampled="):
        Table(SIZE, FIELDS, remover="keep_unread")
    Table(SIZE, FIELDS, remover="keep_unread", max_times_sampled=2).close()


def test_an_illegal_combination_is_refused_naming_the_argument_the_caller_wrote():
    spec = SequenceSpec.build(4, None, True, 0.9)
    with pytest.raises(ValueError, match="rate_limiter: a sequence buffer takes no Queue"):
        Table(SIZE, FIELDS, sequence=spec, rate_limiter=Queue(SIZE))
    with pytest.raises(ValueError, match="remover: a sequence buffer takes no 'keep_unread'"):
        Table(SIZE, FIELDS, sequence=spec, remover="keep_unread")
    with pytest.raises(ValueError, match="selector: a Queue"):
        Table(SIZE, FIELDS, selector="uniform", rate_limiter=Queue(SIZE))
    with pytest.raises(ValueError, match="mmap_prefix: a shared buffer"):
        Table(SIZE, FIELDS, shared=True, mmap_prefix="/tmp/never")


def test_the_named_classes_are_tables_with_their_defaults():
    assert ReplayBuffer(8, FIELDS).config.selector.name == "uniform"
    prioritized = PrioritizedReplayBuffer(8, FIELDS, alpha=0.7)
    assert prioritized.config.selector.name == "prioritized" and prioritized.alpha == 0.7
    with MPPrioritizedSequenceReplayBuffer(64, FIELDS, length=4) as shared:
        assert shared.config.shared and shared.sequence_length == 4 and shared.config.by_priority


@pytest.mark.parametrize("name", buffers.__all__)
def test_every_buffer_class_has_at_most_four_of_the_projects_classes_in_its_mro(name):
    cls = getattr(buffers, name)
    assert len([c for c in cls.__mro__ if c.__module__.startswith("mpreplay")]) <= 4
