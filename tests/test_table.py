"""One table built from parts: every combination the docs call legal goes through the one
constructor; every other is refused naming the argument.

The grid is the contract: every selector x remover x rate limiter x max_times_sampled x storage
(rows, next_of, stack_compress, n-step folding and their mixes) x lanes x sequences that
TableConfig.build accepts -- a test enumerates the whole product to hold the two to each other --
writes the same episodes (one ended by a done step, one by on_episode_end(), one left open, a call
of three steps among them; with two lanes two writers take turns), and what it then holds, lists,
draws (an ordered selector: in exactly the order), retires and saves is checked against the
reference model of tests/table_model.py."""

from __future__ import annotations

import inspect
import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from table_model import EPISODES, GAMMA, STACKED, STORAGES, TableModel, priority_of, stack, step_id

from mpreplay import (
    MinSize,
    MPPrioritizedSequenceReplayBuffer,
    PrioritizedReplayBuffer,
    Queue,
    RateLimiter,
    ReplayBuffer,
    SampleToInsertRatio,
    SequenceSpec,
    Stack,
    Table,
    buffers,
    removers,
    selectors,
)
from mpreplay.table_config import TableConfig

FIELDS = {"obs": {"shape": (2, 3), "dtype": np.uint8}, "act": {"dtype": np.int64}, "done": {}}
SIZE = 64

# -- the grid: every combination TableConfig.build accepts, run against tests/table_model.py --------
LIMITERS: dict[str, Callable[[int], RateLimiter] | None] = {
    "none": None,
    "min_size": lambda size: MinSize(4),
    "ratio": lambda size: SampleToInsertRatio(1.0, 4, 1000.0),
    "queue": Queue,
    "stack": Stack,
}
SEQUENCE = (4, 2)  # length, period
BATCH = 3


@dataclass(frozen=True)
class Case:
    selector: str
    remover: str
    limiter: str
    max_times_sampled: int | None
    shared: bool
    storage: str
    lanes: int
    sequence: bool

    def __str__(self) -> str:
        return "-".join(
            [self.selector, self.remover, self.limiter, f"mts{self.max_times_sampled}"]
            + ["shared" if self.shared else "local", self.storage, f"lanes{self.lanes}"]
            + (["sequence"] if self.sequence else [])
        )

    @property
    def exactly_once(self) -> bool:
        return self.limiter in ("queue", "stack")

    @property
    def keeps_unread(self) -> bool:
        return self.remover == "keep_unread"

    @property
    def width(self) -> int:
        """Slots per lane: a ring that wraps in the scenario, or room for all of it where nothing is replaced."""
        if self.keeps_unread:
            return 64
        return 32 if STORAGES[self.storage].compressed or self.sequence else 16

    def build(self) -> dict[str, Any]:
        """Table's arguments."""
        size = self.width * self.lanes
        make = LIMITERS[self.limiter]
        options: dict[str, Any] = dict(
            selector=self.selector,
            remover=self.remover,
            rate_limiter=None if make is None else make(size),
            max_times_sampled=self.max_times_sampled,
            shared=self.shared,
            lanes=self.lanes,
            sequence=SequenceSpec.build(*SEQUENCE, True, 1.0) if self.sequence else None,
            **STORAGES[self.storage].options(),
        )
        return {"size": size, "env_dict": STORAGES[self.storage].fields(), **options}


def _legal(case: Case) -> bool:
    """Whether the table promises to keep ``case`` (docs/selectors.md, mpreplay.removers):
    TableConfig.build must accept it, and refuse every other by the name of an argument."""
    storage = STORAGES[case.storage]
    if case.exactly_once:  # a Queue (Stack) is the fifo (lifo) selector, keep_unread, each item drawn once
        selector = "fifo" if case.limiter == "queue" else "lifo"
        if (case.selector, case.remover) != (selector, "keep_unread") or case.max_times_sampled not in (None, 1):
            return False
    elif case.keeps_unread and case.max_times_sampled is None:
        return False  # nothing would ever free a slot
    if case.lanes > 1 and not (storage.compressed or case.sequence):
        return False  # lanes are a compressed or sequence table's
    if case.remover == "lifo" and (storage.compressed or case.sequence):
        return False  # it replaces the newest rows, whose frames an episode's next steps read
    if case.sequence:  # its items are sequences: no sample retires them, and it stores single steps
        return not (case.exactly_once or case.keeps_unread or case.max_times_sampled or storage.nstep)
    return True


def _runs(case: Case) -> bool:
    """Whether the grid runs ``case``: every legal local table, and every legal shared one with its least
    options.  A shared table runs the same kernels over a segment: what sharing changes is the memory,
    the lock and the writers' handles, not what a rate limiter or max_times_sampled does, which its
    local twin checks."""
    if not _legal(case):
        return False
    if not case.shared:
        return True
    least = 1 if case.keeps_unread and not case.exactly_once else None
    return case.limiter in ("none", "queue", "stack") and case.max_times_sampled == least


PRODUCT = [
    Case(*values)
    for values in itertools.product(
        selectors.names(), removers.names(), LIMITERS, (None, 1, 2), (False, True), STORAGES, (1, 2), (False, True)
    )
]
GRID = [case for case in PRODUCT if _runs(case)]
ARGUMENTS = set(inspect.signature(TableConfig.build).parameters) - {"cls"} | {"length"}


def test_every_combination_the_table_accepts_is_one_the_grid_runs_and_every_other_is_refused_by_name():
    for case in PRODUCT:
        arguments = case.build()
        if _legal(case):
            TableConfig.build(arguments.pop("size"), arguments.pop("env_dict"), **arguments)
            assert _runs(case) or _runs(replace(case, shared=False)), f"{case}: accepted, and the grid runs no twin"
            continue
        with pytest.raises((ValueError, TypeError)) as refused:
            TableConfig.build(arguments.pop("size"), arguments.pop("env_dict"), **arguments)
        named = str(refused.value).split(":")[0]
        assert named in ARGUMENTS, f"{case}: refused without naming an argument: {refused.value}"


def _write(writers: list[Table], model: TableModel, by_priority: bool, next_obs: bool) -> None:
    """Each writer writes EPISODES, the writers' calls taking turns; the model follows each call."""

    def calls(w: int):
        for e, (adds, how) in enumerate(EPISODES):
            model.begin(w, e)
            length, t = sum(adds), 0
            for k in adds:
                steps = range(t, t + k)
                done = how == "done" and t + k == length
                rows = {
                    "obs": np.stack([stack(w, e, s) for s in steps]),
                    "act": np.array([step_id(w, e, s) for s in steps]),
                    "rew": np.ones(k),
                    "done": np.array([float(how == "done" and s == length - 1) for s in steps]),
                }
                if next_obs:
                    rows["next_obs"] = np.stack([stack(w, e, s + 1) for s in steps])
                if by_priority:
                    rows["priorities"] = np.array([priority_of(step_id(w, e, s)) for s in steps])
                if k == 1:  # one step as an actor passes it
                    rows = {key: value[0].item() if value.ndim == 1 else value[0] for key, value in rows.items()}
                yield lambda rows=rows: writers[w].add(**rows, timeout=0)
                yield lambda k=k, done=done: model.add(w, k, done)
                t += k
            if how == "end":
                yield lambda: writers[w].on_episode_end(timeout=0)
                yield lambda: model.end(w)

    streams = [calls(w) for w in range(len(writers))]
    while streams:
        for stream in list(streams):
            for _ in range(2):  # a call and the model's step
                call = next(stream, None)
                if call is None:
                    streams.remove(stream)
                    break
                call()


def _expected_rows(storage_name: str, items: list[int]) -> dict[str, np.ndarray]:
    """What rows ``items`` hold: their stacks, next stacks (n steps on, or the episode's last) and
    rewards folded over those steps."""
    storage = STORAGES[storage_name]
    obs, next_obs, rew = [], [], []
    for item in items:
        w, e, t = item // 1000, item // 100 % 10, item % 100
        adds, how = EPISODES[e]
        span = storage.span if how == "open" else min(storage.span, sum(adds) - t)
        obs.append(stack(w, e, t))
        next_obs.append(stack(w, e, t + span))
        rew.append(sum(GAMMA**i for i in range(span)))
    rows = {"obs": np.array(obs).reshape(-1, *STACKED), "rew": np.array(rew, dtype=np.float32)}
    if "next_obs" in storage.fields():
        rows["next_obs"] = np.array(next_obs).reshape(-1, *STACKED)
    return rows


def _assert_rows(storage: str, rows: dict[str, np.ndarray]) -> None:
    items = rows["act"].tolist()
    for key, expected in _expected_rows(storage, items).items():
        wrong = [item for item, a, b in zip(items, rows[key], expected, strict=True) if not np.array_equal(a, b)]
        assert not wrong, f"{key} of rows {wrong}"


def _assert_sequences(model: TableModel, batch: dict[str, np.ndarray]) -> None:
    for j, item in enumerate(batch["act"][:, 0].tolist()):
        steps = model.items[item].steps if item in model.items else None
        assert steps is not None and batch["mask"][j].sum() == len(steps)
        assert batch["act"][j, : len(steps)].tolist() == steps


def _drawn(case: Case, batch: dict[str, np.ndarray]) -> list[int]:
    return (batch["act"][:, 0] if case.sequence else batch["act"]).tolist()


@pytest.mark.parametrize("case", GRID, ids=str)
def test_every_accepted_combination_holds_and_draws_what_the_model_says(case):
    arguments = case.build()
    with Table(arguments.pop("size"), arguments.pop("env_dict"), **arguments) as table:
        config = table.config
        ordered, by_priority = config.selector.entry.ordered, config.by_priority
        model = TableModel(
            STORAGES[case.storage], case.lanes, case.width, config.remover, SEQUENCE if case.sequence else None
        )
        if case.limiter != "none":  # every limiter holds a sample of an empty table back
            with pytest.raises(TimeoutError):
                table.sample(1, timeout=0)
        writers = [table] + [table.episode_writer() for _ in range(case.lanes - 1)]
        _write(writers, model, by_priority, "next_obs" in table.get_env_dict())
        stored = table.get_all_transitions()
        if case.sequence:
            assert sorted(stored["act"].tolist()) == model.stored_steps()
        else:
            assert sorted(stored["act"].tolist()) == sorted(model.items)
            _assert_rows(case.storage, stored)
        if ordered and not case.sequence:  # a snapshot lists rows in the order the selector was given them
            assert stored["act"].tolist() == model.listed(by_lane=STORAGES[case.storage].compressed)
        if ordered and config.max_times_sampled is None:  # the whole order, at once
            assert _drawn(case, table.sample(len(model.items), timeout=0)) == model.order(case.selector)
        for turn in range(3):
            batch = table.sample(BATCH, timeout=0)
            drawn = _drawn(case, batch)
            if ordered:
                assert drawn == model.ordered_batch(case.selector, BATCH), f"batch {turn}"
            if case.sequence:
                _assert_sequences(model, batch)
            else:
                _assert_rows(case.storage, batch)
            model.draw(drawn, config.max_times_sampled)
            if by_priority and turn == 0:  # new priorities reorder a heap
                new = [2.0 - priority_of(item) for item in drawn]
                table.update_priorities(batch["indexes"], new)
                for item, priority in zip(drawn, new, strict=True):
                    model.update(item, priority)
            if not case.sequence:
                assert sorted(table.get_all_transitions()["act"].tolist()) == sorted(model.items)
        assert table.verify()["complete"] == table.get_stored_size() > 0
        for writer in writers[1:]:
            writer.close()


@pytest.mark.parametrize(
    "case", [case for case in GRID if case.exactly_once and case.max_times_sampled is None and case.lanes == 1], ids=str
)
def test_a_queue_or_stack_of_any_storage_hands_every_item_out_once_in_its_order_in_one_batch(case):
    arguments = case.build()
    with Table(arguments.pop("size"), arguments.pop("env_dict"), **arguments) as table:
        model = TableModel(STORAGES[case.storage], 1, case.width, "keep_unread", None)
        _write([table], model, False, "next_obs" in table.get_env_dict())
        assert table.sample(len(model.items), timeout=0)["act"].tolist() == model.order(case.selector)
        assert table.get_stored_size() == 0


# Saved and loaded, an ordered table draws what it would have drawn: across a compressed table's
# lanes too, whose file lists its rows lane by lane (the file's insertion.order gives the order back).
ROUND_TRIPS = [
    pytest.param(case, id=str(case))
    for case in GRID
    if selectors.entry(case.selector).ordered
    and not (case.shared or case.sequence)
    and case.limiter in ("none", "queue", "stack")
    and case.max_times_sampled == (1 if case.keeps_unread and not case.exactly_once else None)
]


@pytest.mark.parametrize("case", ROUND_TRIPS)
def test_a_saved_table_loads_into_one_that_draws_in_the_models_order(case):
    arguments = case.build()
    size, env_dict = arguments.pop("size"), arguments.pop("env_dict")
    file = io.BytesIO()
    with Table(size, env_dict, **arguments) as table:
        config = table.config
        model = TableModel(STORAGES[case.storage], case.lanes, case.width, config.remover, None)
        writers = [table] + [table.episode_writer() for _ in range(case.lanes - 1)]
        _write(writers, model, config.by_priority, "next_obs" in table.get_env_dict())
        table.save_transitions(file, priorities=config.by_priority)
        for writer in writers[1:]:
            writer.close()
    file.seek(0)
    with Table(size, env_dict, **arguments) as loaded:
        loaded.load_transitions(file)
        assert loaded.sample(len(model.items), timeout=0)["act"].tolist() == model.order(case.selector)


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
