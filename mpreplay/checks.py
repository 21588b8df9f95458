"""Argument checks of every public entry point, with one meaning everywhere.

Each check returns the value in the form its caller uses (an ``int``, a
``float``, an array) or raises with the message ``"name: expected <what>,
got <value>"``.

Which error:

* :func:`integer` raises ValueError for whatever is not an integer in range:
  a bool, a float (even ``2.0``), None, a string.  A count given as ``2.0``
  or ``True`` is a wrong value, as the buffers have always said.
  :func:`capacity` is the one exception: a buffer's size may be written
  ``1e6`` (an integral float), as cpprb's examples write it.
* :func:`number` and :func:`seconds` raise TypeError for what is not a
  number at all (a string, None, a bool) and ValueError for a number out of
  range (NaN, and the infinities unless allowed, are out of every range).

Timeouts (:func:`seconds`): None is no limit, 0 is "do not wait" (try
once), a finite number > 0 is "wait at most that long".

Nothing here imports torch: a tensor can only exist once its caller has
imported it (:func:`is_tensor`).
"""

from __future__ import annotations

import math
import re
import reprlib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, overload

import numpy as np

if TYPE_CHECKING:  # named for the type checker only; see is_tensor
    import torch

__all__ = [
    "capacity",
    "flag",
    "indexes",
    "integer",
    "is_tensor",
    "matrix",
    "number",
    "priorities",
    "seconds",
    "state_arrays",
    "table_name",
]

# numpy's own dtype instances: `is` tells them apart faster than `==` (the hot paths check them).
_INT64, _UINT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.float64)

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 40


def _show(value: Any) -> str:
    """A short repr of a refused value (an array passed by mistake stays one line)."""
    return _repr.repr(value)


def _bound(value: float) -> str:
    return f"{value:g}"


def integer(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (``high`` None: no upper bound).

    Python and numpy integers are integers; bools and floats are not.
    """
    if type(value) is int and low <= value and (high is None or value <= high):
        return value  # the common case, first: these checks run on every call
    if (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and low <= value
        and (high is None or value <= high)
    ):
        return int(value)
    what = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    raise ValueError(f"{name}: expected {what}, got {_show(value)}")


def capacity(name: str, value: Any, *, low: int = 1) -> int:
    """``value`` as an ``int`` >= ``low``: an integer, or a float with an integral value (``1e6``).

    Only capacities take floats: ``size=1e6`` is how cpprb's documentation
    writes them, and nothing is lost when the float is integral.
    """
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    try:
        return integer(name, value, low=low)
    except ValueError:
        raise ValueError(
            f"{name}: expected an integer >= {low} (an integral float such as 1e6 is accepted), got {_show(value)}"
        ) from None


def _real(value: Any) -> float | None:
    """``value`` as a float if it is one real number, else None.

    Python and numpy numbers, 0-d arrays and one-element tensors are numbers;
    bools and strings (even "1.5") are not.
    """
    if type(value) is float:
        return value
    if (
        isinstance(value, (bool, np.bool_, str, bytes))
        or not hasattr(type(value), "__float__")
        or (isinstance(value, np.ndarray) and value.ndim)
    ):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):  # complex, a tensor of several values
        return None


def number(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a ``float`` between ``low`` and ``high`` (included unless ``low_open`` /
    ``high_open``), finite unless ``finite=False`` (which lets the infinities through, never NaN)."""
    if (
        type(value) is float
        and low <= value <= high
        and not (low_open or high_open)
        and (value - value == 0.0 or not finite)
    ):
        return value  # the common case, first: these checks run on every call (x - x is 0 when x is finite)
    v = _real(value)
    if v is None:
        raise TypeError(f"{name}: expected a number, got {_show(value)}")
    if (
        (finite and not math.isfinite(v))
        or not (low < v if low_open else low <= v)
        or not (v < high if high_open else v <= high)
    ):
        if low > -math.inf and high < math.inf:
            span = f" in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"
        elif low > -math.inf:
            span = f" {'>' if low_open else '>='} {_bound(low)}"
        elif high < math.inf:
            span = f" {'<' if high_open else '<='} {_bound(high)}"
        else:
            span = ""
        raise ValueError(f"{name}: expected {'a finite' if finite else 'a'} number{span}, got {_show(value)}")
    return v


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    """``value`` when it is one of ``options`` (strings)."""
    if not (isinstance(value, str) and value in options):
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, options))}, got {_show(value)}")
    return value


def dtype(name: str, value: Any, options: tuple[Any, ...]) -> np.dtype:
    """``value`` as a numpy dtype, when it is one of ``options``."""
    try:
        got = np.dtype(value)
    except TypeError:
        got = None
    if got not in options:
        expected = ", ".join(np.dtype(o).name for o in options)
        raise ValueError(f"{name}: expected one of the dtypes {expected}, got {_show(value)}")
    return got


@overload
def seconds(name: str, value: Any, *, allow_none: Literal[False]) -> float: ...
@overload
def seconds(name: str, value: Any, *, allow_none: bool = True) -> float | None: ...
def seconds(name: str, value: Any, *, allow_none: bool = True) -> float | None:
    """A time in seconds: a finite number >= 0, or None (no limit) when ``allow_none``.

    For a timeout, 0 means "do not wait": try once.
    """
    if value is None and allow_none:
        return None
    what = "None (no limit) or a finite number of seconds >= 0" if allow_none else "a finite number of seconds >= 0"
    v = _real(value)
    if v is None:
        raise TypeError(f"{name}: expected {what}, got {_show(value)}")
    if not 0.0 <= v < math.inf:
        raise ValueError(f"{name}: expected {what}, got {_show(value)}")
    return v


def flag(name: str, value: Any) -> bool:
    """``value`` as a ``bool``; only Python and numpy bools are flags."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {_show(value)}")
    return bool(value)


# A table's name becomes a file name in /dev/shm: letters, digits, ".", "_", "-", not first a dot
# (hidden) or a dash (an option to the commands that take it); NAME_MAX is 255 bytes.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


def table_name(name: str, value: Any) -> str:
    """``value`` as the name of a shared table: 1 to 200 letters, digits, ``.``, ``_`` or ``-``,
    the first a letter, digit or ``_``."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a table's name (a str), got {_show(value)}")
    if not _TABLE_NAME.fullmatch(value):
        raise ValueError(
            f"{name}: expected 1 to 200 letters, digits, '.', '_' or '-' (the first no '.' or '-'), got {_show(value)}"
        )
    return value


def is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``value`` is a torch tensor (never imports torch)."""
    torch = sys.modules.get("torch")  # a tensor cannot exist unless torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def _numpy(value: Any) -> Any:
    return value.detach().cpu().numpy() if is_tensor(value) else value


def _kernel_ready(array: np.ndarray, dtype: np.dtype) -> bool:
    """Whether ``array`` is what the kernels read as it is: 1-D, C-contiguous, aligned, native ``dtype``."""
    return (
        type(array) is np.ndarray
        and array.dtype is dtype
        and array.ndim == 1
        and array.flags.c_contiguous
        and array.flags.aligned
    )


def _aligned(array: np.ndarray) -> np.ndarray:
    # A view into a byte buffer at an odd offset is contiguous but not aligned: its copy is.
    return array if array.flags.aligned else array.copy()


def indexes(name: str, values: Any) -> np.ndarray:
    """``values`` (a list, an array, a tensor or one integer) as a 1-D contiguous, aligned int64 array.

    Unsigned indexes are taken as they are (cpprb hands out uint64), and floats
    when they are whole numbers.  Their range is the caller's to check (a uint64
    of 2**63 or more reads as negative, which no range admits).
    """
    idx = values
    if _kernel_ready(idx, _INT64):
        return idx
    if _kernel_ready(idx, _UINT64):
        return idx.view(_INT64)
    try:
        idx = np.asarray(_numpy(values))
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected integers, got {type(values).__name__}") from None
    if idx.ndim > 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {idx.shape}")
    if idx.size and idx.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            fractional = np.flatnonzero(~np.isfinite(idx) | (idx != np.floor(idx)))
        if fractional.size:
            j = int(fractional[0])
            raise ValueError(f"{name}: expected integers, got {idx.reshape(-1)[j]!r} at position {j}")
    elif idx.size and idx.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {idx.dtype}")
    idx = idx.reshape(-1)
    if idx.dtype == _UINT64:
        return _aligned(np.ascontiguousarray(idx)).view(_INT64)
    return _aligned(np.ascontiguousarray(idx, dtype=np.int64))


def matrix(name: str, values: Any, *, kind: str) -> np.ndarray:
    """``values`` (nested lists, an array, a tensor) as a 2-D contiguous array.

    ``kind`` is ``"b"`` (bools only, as a bool array) or ``"f"`` (bool-free
    integers or floats, as float64, every value finite).
    """
    try:
        m = np.asarray(_numpy(values))
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a 2-D array, got {type(values).__name__}") from None
    if kind == "b" and m.dtype != np.bool_:
        raise TypeError(f"{name}: expected bools, got dtype {m.dtype}")
    if kind == "f" and m.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected numbers, got dtype {m.dtype}")
    if m.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {m.shape}")
    if kind == "b":
        return np.ascontiguousarray(m)
    m = np.ascontiguousarray(m, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(m))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name}: expected finite numbers, got {float(m[at])!r} at {at}")
    return m


def priorities(name: str, values: Any, count: int, *, max_priority: float | np.ndarray | None) -> np.ndarray:
    """``values`` as ``count`` contiguous, aligned float64 priorities: ``count`` numbers (a list,
    an array of any shape, a tensor, e.g. a loss of shape (count, 1)), or one number for all.

    Each must be finite, >= 0 and <= ``max_priority`` (one number, or one
    maximum per value: what the buffer that stores it accepts, see
    ``PrioritizedReplayBuffer.max_priority``).  ``max_priority=None`` leaves
    the range to the ring kernel that takes the priorities next
    (``TableHandle.check_priorities`` and ``TableHandle.update`` check it, with the same message).
    """
    p = values
    if not _kernel_ready(p, _FLOAT64):
        if values is None:  # numpy would make it NaN
            raise TypeError(f"{name}: expected numbers, got None")
        try:
            p = np.asarray(_numpy(values), dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected numbers, got {type(values).__name__}") from None
        p = np.full(count, p) if p.ndim == 0 else _aligned(np.ascontiguousarray(p.reshape(-1)))
    if len(p) != count:
        raise ValueError(f"{name}: expected {count} values (one per transition), got {len(p)}")
    if max_priority is not None:
        limit = np.asarray(max_priority, dtype=np.float64)
        bad = np.flatnonzero(~(np.isfinite(p) & (p >= 0.0) & (p <= limit)))
        if bad.size:
            j = int(bad[0])
            top = float(limit if limit.ndim == 0 else limit[j])
            raise ValueError(f"{name}: expected finite values in [0, {top:.3g}], got {float(p[j])!r} at position {j}")
    return p


def state_arrays(
    name: str, state: Any, expected: Mapping[str, tuple[tuple[int, ...], np.dtype | None]]
) -> dict[str, np.ndarray]:
    """Copies of the arrays of ``state`` (argument ``name``): a mapping with exactly the entries of
    ``expected``, each of the shape and (where one is given) the dtype ``expected`` names; ValueError
    naming the first entry that differs otherwise."""
    if not isinstance(state, Mapping) or set(state) != set(expected):
        got = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"{name}: expected the entries {sorted(expected)}, got {got}")
    out = {}
    for key, (shape, dt) in expected.items():
        value = np.asarray(state[key])
        if value.shape != shape or (dt is not None and value.dtype != dt):
            want = f"shape {shape}" + ("" if dt is None else f" and dtype {dt}")
            raise ValueError(f"{name}[{key!r}]: expected {want}, got shape {value.shape} and dtype {value.dtype}")
        out[key] = value.copy()
    return out
