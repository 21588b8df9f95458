"""The selectors a table is built with: one registry, read by every part that needs to know one.

A selector decides which stored items (transitions, or sequences) ``sample`` draws.  Each is a
kernel in ``ext/<kernel>.pyx`` (with its ``.pxd``), a subclass of ``ext/selector.pyx``'s
``Selector`` (insert, update, remove, sample: Reverb's ``ItemSelector``), and one entry of
:data:`SELECTORS` below.  The segment layout (the selector's one array), the manifest (its
``"selector"`` entry and the array it checks), ``mpreplay ls`` / ``top`` and the buffers all read
the entry: adding a selector is its kernel files and one line here (``setup.py`` builds every
kernel in ``ext/``).

A selector's kernel module provides:

* ``STATE_DTYPE`` and ``state_size(capacity)``: its one array, in the table's memory (heap or
  shared segment), so every process mapping the segment selects from the same state; the
  array holds all the selector's state, and ``rebuild`` recomputes what it derives from the
  per-item entries it writes first (crash recovery);
* the class, built as ``cls(state, capacity, reset=True, **options)`` (``reset=False``
  attaches to a state another process initialised);
* optionally ``priority_views(state, capacity)``: ``(weights, priorities)`` per item, read-only
  views (a weight of 0: not drawable), which ``mpreplay top`` reads for its histogram.
* optionally ``cut_parts(state, capacity)`` and ``derive(state, capacity)``: the views of the
  state that nothing derives -- ``(items, rest)``: arrays of an entry per item, and the others
  -- and the recomputation of everything else from them.  A checkpoint of a table whose
  selector has them takes its cut a block of slots at a time (``mpreplay.checkpoint_cut``);
  a selector without them (an order over its items, a packed list) is copied whole in one hold.

Selection rules:

* ``"uniform"`` and ``"prioritized"`` draw at random, with replacement: every draw of a batch is
  independent (``prioritized``: in proportion to ``(priority + eps) ** alpha``, stratified as in
  Ape-X).
* The ordered selectors (``"fifo"``, ``"lifo"``, ``"max_heap"``, ``"min_heap"``) draw by their
  order: a batch of ``k`` is the first ``k`` drawable items in order, each once, when there are
  at least ``k``; with ``n < k`` drawable items it is those ``n`` in order, repeated from the
  first.  Ties (equal priorities) go to the item inserted first.  Without ``max_times_sampled``
  nothing is removed by sampling, so the next batch starts from the same first item, as
  Reverb's ``k`` successive samples of a table that removes nothing do.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import checks
from ._ext.schema import MEMBERS_ARRAY, TREE_ARRAY, selector_array

__all__ = [
    "SELECTORS",
    "SelectorEntry",
    "SelectorSpec",
    "cut_parts",
    "derive",
    "entry",
    "kernels",
    "make",
    "names",
    "priorities",
    "priority_views",
    "state_array",
]


def _no_options(**options: Any) -> dict[str, Any]:
    if options:
        raise TypeError(f"selector options: this selector takes none, got {sorted(options)}")
    return {}


def _prioritized_options(alpha: float = 0.6, eps: float = 1e-4, new_priority: str = "max_stored") -> dict[str, Any]:
    return {
        "alpha": checks.number("alpha", alpha, low=0.0),
        "eps": checks.number("eps", eps, low=0.0),
        "max_ever": checks.choice("new_priority", new_priority, ("max_stored", "max_ever")) == "max_ever",
    }


@dataclass(frozen=True)
class SelectorEntry:
    """One selector: what ``selector=`` and the manifest call it, its kernel, its rule."""

    name: str
    kernel: str  # the module mpreplay._ext.<kernel> (ext/<kernel>.pyx)
    cls: str  # its Selector subclass
    description: str  # one line: what it draws
    by_priority: bool = False  # it draws by the priorities given (a prioritized buffer's selector)
    ordered: bool = False  # a batch is the first k items in its order (see the module docstring)
    options: Callable[..., dict[str, Any]] = field(default=_no_options, repr=False)  # checked -> kernel kwargs
    array: str = ""  # its array in the segment; "" -> schema.selector_array(name)

    @property
    def array_name(self) -> str:
        return self.array or selector_array(self.name)

    @property
    def proportional(self) -> bool:
        """Whether a draw picks items at random in proportion to their priority weights, so that the
        table's total weight weighs it against other tables (what a client sampling several shards
        needs, :mod:`mpreplay.sharded`); an ordered selector's total is merely its item count."""
        return self.by_priority and not self.ordered


SELECTORS: tuple[SelectorEntry, ...] = (
    SelectorEntry("uniform", "uniform", "UniformSelector", "every stored item equally likely", array=MEMBERS_ARRAY),
    SelectorEntry(
        "prioritized",
        "prioritized",
        "PrioritizedSelector",
        "in proportion to (priority + eps) ** alpha",
        by_priority=True,
        options=_prioritized_options,
        array=TREE_ARRAY,
    ),
    SelectorEntry("fifo", "fifo", "FifoSelector", "the oldest inserted item first", ordered=True),
    SelectorEntry("lifo", "lifo", "LifoSelector", "the newest inserted item first", ordered=True),
    SelectorEntry(
        "max_heap", "max_heap", "MaxHeapSelector", "the highest priority first", by_priority=True, ordered=True
    ),
    SelectorEntry(
        "min_heap", "min_heap", "MinHeapSelector", "the lowest priority first", by_priority=True, ordered=True
    ),
)

_BY_NAME = {e.name: e for e in SELECTORS}


def names() -> tuple[str, ...]:
    """The registered selectors' names."""
    return tuple(_BY_NAME)


def kernels() -> tuple[str, ...]:
    """The kernel modules of the registered selectors."""
    return tuple(dict.fromkeys(e.kernel for e in SELECTORS))


def entry(name: str) -> SelectorEntry:
    """The entry named ``name`` (ValueError naming the registered ones if there is none)."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"selector: expected one of {list(_BY_NAME)}, got {name!r}") from None


@dataclass(frozen=True)
class SelectorSpec:
    """A selector and its options, what ``selector=`` takes (a name alone: its defaults).

    ``name`` is an entry of :data:`~mpreplay.selectors.SELECTORS`: ``"uniform"``, ``"prioritized"``, ``"fifo"``,
    ``"lifo"``, ``"max_heap"``, ``"min_heap"``.  Only ``"prioritized"`` has options: ``alpha``
    (0.6), ``eps`` (1e-4) and ``new_priority`` (``"max_stored"`` or ``"max_ever"``); the others
    refuse them (TypeError).  The options are checked when the spec is made.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import ReplayBuffer, SelectorSpec
    >>> spec = SelectorSpec("prioritized", alpha=0.7, new_priority="max_ever")
    >>> spec.kernel_options()
    {'alpha': 0.7, 'eps': 0.0001, 'max_ever': True}
    >>> rb = ReplayBuffer(100, {"obs": {}}, selector=spec)  # any class takes any selector
    >>> rb.alpha
    0.7
    >>> rb.close()
    >>> SelectorSpec("fifo", alpha=0.5)
    Traceback (most recent call last):
    ...
    TypeError: selector options: this selector takes none, got ['alpha']
    """

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    def __init__(
        self,
        name: str,
        *,
        alpha: float | None = None,
        eps: float | None = None,
        new_priority: str | None = None,
    ) -> None:
        # The prioritized selector's options, the only ones any selector has (None: not given).
        options = {
            key: value
            for key, value in (("alpha", alpha), ("eps", eps), ("new_priority", new_priority))
            if value is not None
        }
        object.__setattr__(self, "name", entry(name).name)
        entry(name).options(**options)  # checked now, so a bad spec never reaches a buffer
        object.__setattr__(self, "options", tuple(sorted(options.items())))

    @classmethod
    def of(cls, selector: str | SelectorSpec) -> SelectorSpec:
        """``selector`` as a spec: a name becomes the spec of its defaults."""
        if isinstance(selector, SelectorSpec):
            return selector
        if isinstance(selector, str):
            return cls(selector)
        raise TypeError(
            f"selector: expected a selector name {list(_BY_NAME)} or a SelectorSpec, got {type(selector).__name__}"
        )

    @property
    def entry(self) -> SelectorEntry:
        return entry(self.name)

    def kernel_options(self) -> dict[str, Any]:
        """The keyword arguments of the kernel class, defaults filled in."""
        return self.entry.options(**dict(self.options))


def _module(e: SelectorEntry) -> Any:
    try:
        return importlib.import_module(f"mpreplay._ext.{e.kernel}")
    except ImportError as exc:
        raise ImportError(
            f"selector {e.name!r}: its kernel mpreplay._ext.{e.kernel} is not built "
            f"(build the kernels: python setup.py build_ext --inplace): {exc}"
        ) from exc


def state_array(name: str, capacity: int) -> tuple[str, int, np.dtype]:
    """``(array name, length, dtype)`` of the state of selector ``name`` over ``capacity`` items."""
    e = entry(name)
    module = _module(e)
    return e.array_name, int(module.state_size(capacity)), np.dtype(module.STATE_DTYPE)


def make(spec: SelectorSpec, state: np.ndarray, capacity: int, reset: bool) -> Any:
    """The kernel selector of ``spec`` over ``state``; ``reset`` initialises the state."""
    return getattr(_module(spec.entry), spec.entry.cls)(state, capacity, reset, **spec.kernel_options())


def check_state(name: str, state: np.ndarray, capacity: int, drawable: np.ndarray) -> list[str]:
    """What disagrees in selector ``name``'s ``state`` with ``drawable`` (per item: whether the
    slot states let it be drawn), as sentences for a table's ``verify()``: its kernel class's
    ``check_state``."""
    e = entry(name)
    return list(getattr(_module(e), e.cls).check_state(state, capacity, drawable))


def priority_views(name: str, state: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(weights, priorities)`` of every item of selector ``name``'s ``state``, views (a weight
    of 0: not drawable); None: the selector keeps no priorities."""
    views = getattr(_module(entry(name)), "priority_views", None)
    return None if views is None else views(state, capacity)


def cut_parts(name: str, state: np.ndarray, capacity: int) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """``(items, rest)`` views of selector ``name``'s ``state`` a checkpoint's cut copies a block
    of items at a time (``items``) and whole (``rest``); None: the state is not so divided."""
    parts = getattr(_module(entry(name)), "cut_parts", None)
    return None if parts is None else parts(state, capacity)


def derive(name: str, state: np.ndarray, capacity: int) -> None:
    """Recompute in ``state`` what selector ``name`` derives from its :func:`cut_parts`."""
    _module(entry(name)).derive(state, capacity)


def priorities(name: str, state: np.ndarray, capacity: int) -> np.ndarray | None:
    """The priorities of the items drawable now, read from outside without the lock (None: the
    selector keeps no priorities).  Copied before they are judged: writers change them meanwhile."""
    views = priority_views(name, state, capacity)
    if views is None:
        return None
    weights, raw = (a.copy() for a in views)
    return raw[(weights > 0) & np.isfinite(raw)]
