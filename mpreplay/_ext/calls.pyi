# Types of the compiled module built from ext/calls.pyx (keep the two in step; CI's stubtest
# compares them).  These are the per-step calls of every table, so a user's type checker sees
# them on ReplayBuffer, PrioritizedReplayBuffer, ... through mpreplay.Table.
from numpy.typing import ArrayLike
from typing_extensions import disjoint_base

from ..spec import Batch

@disjoint_base  # a Cython extension type: no class can derive from it and another such type
class TableCalls:
    """The calls of :class:`mpreplay.Table` that a loop makes every step."""

    def _bind_calls(
        self,
        kernel: object,
        plain_rows: bool,
        by_priority: bool = False,
        float32_weights: bool = False,
        uint64_indexes: bool = False,
        readonly: bool = False,
        frames: object = None,
    ) -> None: ...
    def add(self, *, priorities: ArrayLike | None = None, timeout: float | None = None, **fields: ArrayLike) -> int:
        """Store one transition, or a batch with a leading dimension; returns the slot of the first
        row stored (-1: an n-step table stored none yet)."""

    def add_row(self, fields: dict[str, object]) -> int:
        """The kernel's add of one transition of a dict of plain values; -1 when it needs :meth:`add`."""

    def sample(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        timeout: float | None = None,
        out: Batch | None = None,
    ) -> Batch:
        """Draw ``batch_size`` items by the table's selector: every field, ``indexes`` (and ``weights``)."""

    def update_priorities(self, indexes: ArrayLike, priorities: ArrayLike) -> None:
        """Set new priorities of sampled items (a table whose selector draws by priority)."""
