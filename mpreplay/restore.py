"""Restoring a checkpoint (:mod:`mpreplay.checkpoint`): ``mpreplay.restore``.

The manifest is read and checked, the configuration rebuilt from its JSON and the layout it
computes compared with the arrays recorded; a new table of that configuration -- shared or
local, under a name or a fresh one -- is made and its arrays read from ``data.bin``, every
chunk checked against its checksum before the table is handed out.  Rows the checkpoint left
out become free slots (the table is repaired as after a writer's death), every lane is free
for the next writer, and the table draws from the random stream the checkpointing handle had.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from . import buffers, checks
from ._ext.schema import CLOSED, HEADER_ARRAY, LANE_OWNER, LANES_ARRAY, WAITERS
from .checkpoint import NOT_STORED, read_manifest
from .checkpoint_read import read_arrays
from .config_json import from_json
from .errors import CheckpointError
from .table import Table
from .table_assembly import restored
from .table_files import table_layout

__all__ = ["restore"]

# The numpy bit generators a checkpoint's random stream may name.
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def restore(
    path: str | os.PathLike[str], *, name: str | None = None, shared: bool = True, persist: bool = False
) -> Table:
    """The table the checkpoint at folder ``path`` (written by :meth:`Table.checkpoint`) holds.

    ``shared``: in a shared-memory segment (named ``name``, which must not exist yet, or a
    fresh name) or (False) in this process's memory -- a table whose arrays were in files of an
    ``mmap_prefix`` gets those files again, rewritten.  The table is of the class that wrote
    the checkpoint, holds every row the checkpoint kept with its priority, place in the
    selector's order and times sampled, the counters and the rate limiter's state, and draws
    what the checkpointing handle would have drawn next.  A checkpoint that is damaged,
    truncated or of another format version is refused with
    :class:`~mpreplay.errors.CheckpointError` naming the file (and the array and chunk), and no
    table is left behind.  ``persist``: a shared table that outlives this process, as
    ``Table(..., persist=True)`` makes one (see :func:`mpreplay.attach`).

    Examples
    --------
    >>> import tempfile, numpy as np, mpreplay
    >>> table = mpreplay.Table(8, {"obs": {}}, seed=1)
    >>> table.add(obs=np.arange(5.0))
    0
    >>> folder = tempfile.mkdtemp()
    >>> _ = table.checkpoint(folder + "/replay")
    >>> again = mpreplay.restore(folder + "/replay", shared=False)
    >>> again.get_stored_size(), bool((again.sample(3)["obs"] == table.sample(3)["obs"]).all())
    (5, True)
    >>> again.close(); table.close()
    """
    shared, persist = checks.flag("shared", shared), checks.flag("persist", persist)
    if persist and not shared:
        raise ValueError("persist: only a shared table outlives the process that made it; pass shared=True")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected a segment name (str) or None, got {type(name).__name__}")
    if name is not None and not shared:
        raise ValueError("name: only a shared table has a segment name; pass shared=True or name=None")
    doc = read_manifest(path)
    if shared and isinstance(doc.get("config"), dict) and doc["config"].get("mmap_prefix") is not None:
        raise ValueError(
            "shared: a table whose arrays were in files (mmap_prefix) restores as a local one (shared=False)"
        )
    try:
        config = dataclasses.replace(from_json(doc["config"], shared=shared), persist=persist)
        layout = table_layout(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{os.fspath(path)}: its configuration is not one this mpreplay builds ({exc!r})"
        ) from None
    expected = [[n, list(shape), dtype] for n, shape, dtype, _ in layout.entries if n not in NOT_STORED]
    recorded = sorted([e["name"], e["shape"], e["dtype"]] for e in doc["arrays"])
    if sorted(expected) != recorded:
        differ = next((a, b) for a, b in zip(sorted(expected) + [None], recorded + [None], strict=False) if a != b)
        raise CheckpointError(
            f"{os.fspath(path)}: its arrays are not the layout of its configuration here (first difference: "
            f"expected {differ[0]}, recorded {differ[1]})"
        )
    rng = _generator(path, doc["rng"])

    def fill(arrays: dict[str, np.ndarray]) -> None:
        read_arrays(path, doc, arrays)
        # Nobody waits on, or writes to, a table just made.
        arrays[HEADER_ARRAY][[WAITERS, CLOSED]] = 0
        arrays[LANES_ARRAY][:, LANE_OWNER] = 0

    return restored(_class(doc["class"]), config, rng, fill, bool(doc["repair"]), name)


def _class(kind: Any) -> type[Table]:
    """The class that wrote a checkpoint, where it is one of mpreplay's tables (else Table)."""
    cls = getattr(buffers, str(kind), None) if str(kind) in buffers.__all__ else None
    return cls if isinstance(cls, type) and issubclass(cls, Table) else Table


def _generator(path: str | os.PathLike[str], state: Any) -> np.random.Generator:
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    if kind not in _BIT_GENERATORS:
        raise CheckpointError(f"{os.fspath(path)}: random stream {kind!r}: expected one of {_BIT_GENERATORS}")
    bitgen = getattr(np.random, kind)()
    try:
        bitgen.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{os.fspath(path)}: its random stream's state is not {kind}'s ({exc!r})") from None
    return np.random.Generator(bitgen)
