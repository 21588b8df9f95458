"""The segment schema (ext/schema.pyx) is the one place that names a buffer's arrays: no other
module of mpreplay spells an array's name, or the prefix of a family of arrays (``field:``,
``frames:``, ``selector:``), as a string literal.  A module that did would hold a second copy of
the layout, free to drift from the first."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import transition_fields

import mpreplay
from mpreplay import (
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
    selectors,
)

PACKAGE = pathlib.Path(mpreplay.__file__).parent
ENV = transition_fields((4,))
STACKED = {"obs": {"shape": (3, 2, 4), "dtype": np.uint8}, "next_obs": {"shape": (3, 2, 4), "dtype": np.uint8}}

# Where a string equal to an array's name means something else: per module and string, the uses
# (see _use) allowed, and what the string means there.  Any other use of it is an array's name.
ALLOWED: dict[tuple[str, str], tuple[set[str], str]] = {
    ("_ext/__init__.py", "lock"): ({"tuple"}, "the kernel mpreplay._ext.lock, among those checked to be built"),
    ("bench/apex.py", "writers"): ({"list"}, "a column of `bench apex`'s lock table: how many writer processes"),
    ("bench/mp_workloads.py", "lanes"): ({"dict key"}, "the `lanes=` argument of a compressed buffer"),
    ("bench/peer_frames.py", "rows"): ({"dict key"}, "a benchmark result's entry: rows drawn"),
    ("bench/per_peers.py", "rows"): ({"dict key", "rs[0][]", "row[]"}, "a benchmark result's entry: rows drawn"),
    ("cli.py", "owner"): ({"list"}, "a column of `mpreplay ls`: the process that made the segment"),
    ("cli.py", "writers"): ({"list"}, "a column of `mpreplay ls`: how many writer processes published"),
    ("compat/cpprb/HER.py", "state"): ({"tuple"}, "cpprb's HER argument naming the state field"),
    ("compression.py", "lanes"): ({"checks.integer()"}, "the `lanes=` argument, named in its check's message"),
    ("table_config.py", "lanes"): ({"dict key"}, "the `lanes=` argument a manifest keeps"),
    ("demo/processes.py", "state"): (
        {"dict key", "optimizer.state_dict()[]"},
        "torch's optimizer state dict: its per-parameter 'state' entry",
    ),
    ("consistency.py", "lanes"): ({"dict key"}, "an entry of verify()'s report: how many lanes the buffer has"),
    ("manifest.py", "owner"): ({"dict key", "document[]"}, "the manifest's entry for its creator's process token"),
    ("monitor.py", "owner"): ({"document[]", "tuple"}, "the manifest's entry for its creator's token"),
}


def _buffers(tmp_path: pathlib.Path) -> Iterator[Any]:
    """A buffer of every kind whose layout differs: each selector, compression with next_of and
    stack_compress, sequences, max_times_sampled, fields in files, and a shared segment's lock."""
    for name in selectors.names():
        cls = PrioritizedReplayBuffer if selectors.entry(name).by_priority else ReplayBuffer
        yield cls(16, ENV, selector=name)
    yield ReplayBuffer(64, STACKED, next_of="obs", stack_compress="obs")
    yield SequenceReplayBuffer(16, ENV, length=4, period=2)
    yield ReplayBuffer(16, ENV, max_times_sampled=1)
    yield ReplayBuffer(16, ENV, mmap_prefix=str(tmp_path / "replay"))
    yield MPReplayBuffer(16, ENV)
    yield MPPrioritizedSequenceReplayBuffer(64, STACKED, next_of="obs", stack_compress="obs", length=4, period=2)


@pytest.fixture(scope="module")
def array_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every name the schema gives an array of a buffer, and the prefix of each family of arrays
    named after a field, an observation or a selector (``field:obs`` gives ``field:`` too)."""
    names: set[str] = set()
    for buffer in _buffers(tmp_path_factory.mktemp("files")):
        try:
            names.update(buffer.inspection().arrays)
        finally:
            buffer.close()
    return names | {name[: name.index(":") + 1] for name in names if ":" in name}


def _use(parent: ast.AST) -> str:
    """How a string constant whose parent node is ``parent`` is used: ``x[]`` (indexing ``x``),
    ``f()`` (an argument of ``f``), ``name =``, ``dict key``, ``list``, ``tuple``, ..."""
    if isinstance(parent, ast.Subscript):
        return f"{ast.unparse(parent.value)}[]"
    if isinstance(parent, ast.Call):
        return f"{ast.unparse(parent.func)}()"
    if isinstance(parent, ast.Assign):
        return " ".join(ast.unparse(target) for target in parent.targets) + " ="
    if isinstance(parent, ast.Dict):
        return "dict key"
    return type(parent).__name__.lower()


def _literals() -> Iterator[tuple[str, str, str, int]]:
    """``(module path under mpreplay/, string, use, line)`` of every string constant of the
    package's sources (the parts of an f-string outside its braces included)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for parent in ast.walk(ast.parse(path.read_text(), str(path))):
            for node in ast.iter_child_nodes(parent):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    yield path.relative_to(PACKAGE).as_posix(), node.value, _use(parent), node.lineno


def test_the_names_cover_every_family_of_arrays(array_names):
    assert {"field:", "frames:", "selector:", "header", "lock", "nxt", "rows", "times_sampled"} <= array_names


def test_no_module_spells_a_segment_array_name_as_a_string_literal(array_names):
    found = [
        f"mpreplay/{path}:{line}: {text!r} ({use})"
        for path, text, use, line in sorted(_literals())
        if text in array_names and use not in ALLOWED.get((path, text), ((), ""))[0]
    ]
    assert not found, "array names spelled outside ext/schema.pyx:\n" + "\n".join(found)


def test_every_allowed_literal_is_still_there(array_names):
    spelled = {(path, text, use) for path, text, use, _ in _literals()}
    allowed = {(path, text, use) for (path, text), (uses, _) in ALLOWED.items() for use in uses}
    assert allowed <= spelled, f"no longer needed: {sorted(allowed - spelled)}"
    assert all(text in array_names for _, text in ALLOWED)
