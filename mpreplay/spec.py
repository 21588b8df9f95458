"""Field specs: normalising cpprb-style ``env_dict`` and checking every ``add``.

A batch handed to a buffer is validated and converted as a whole before the
buffer changes, so a bad field never leaves half a transition behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

import numpy as np

if TYPE_CHECKING:  # a type of torch's, named only for type checkers: torch is optional
    import torch

__all__ = ["Array", "Batch", "EnvDict", "FieldOptions", "FieldSpec", "TensorBatch", "parse_env_dict", "convert_batch"]


class FieldOptions(TypedDict, total=False):
    """One field of an ``env_dict``, as cpprb spells it: ``shape`` (an int or a sequence of ints;
    none: a scalar per transition), ``dtype`` (none: the table's ``default_dtype``, float32
    unless given) and cpprb's ``add_shape`` annotation (accepted when it agrees).

    Annotate an ``env_dict`` with it to have a type checker check each entry's keys (a misspelt
    ``"shap"`` is an error) and its shapes; a table's :meth:`~mpreplay.Table.get_env_dict` gives
    them back so.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import FieldOptions, ReplayBuffer
    >>> env_dict: dict[str, FieldOptions] = {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}
    >>> rb = ReplayBuffer(100, env_dict)
    >>> rb.get_env_dict()["act"]
    {'shape': (), 'dtype': dtype('int64')}
    """

    shape: int | Sequence[int]
    # A dtype, a scalar type or its name, checked when the table is built: not numpy's DTypeLike nor
    # np.dtype[np.generic], whose Any a user's --disallow-any-expr refuses.
    dtype: object
    add_shape: int | Sequence[int]


#: A table's fields as cpprb spells them (``env_dict``): each field's name, an identifier, to
#: its options, a mapping such as :class:`FieldOptions`, e.g. ``{"obs": {"shape": (4,)},
#: "act": {"dtype": np.int64}, "rew": {}}``; the options' values are checked when a table is
#: built (a TypeError or ValueError naming the field).  A field given anything but a mapping
#: (``{"obs": (4,)}``) is a type error.  The second member is what mypy infers for a variable
#: holding such a literal whose fields' options differ in type (``dict[str, object]``: it joins
#: the entries' types to ``object``); annotate the variable ``dict[str, FieldOptions]`` to have
#: each entry checked.
EnvDict: TypeAlias = Mapping[str, Mapping[str, object]] | dict[str, object]

#: One field of a sampled batch: an array of any shape and dtype (the field's, with the batch
#: first).  Spelt without ``Any`` so that a user's ``mypy --disallow-any-expr`` accepts it.
Array: TypeAlias = np.ndarray[tuple[int, ...], np.dtype[np.generic]]

#: What ``sample`` returns: each field's name (and ``indexes``, ``weights``, ...) to its array.
Batch: TypeAlias = dict[str, Array]

#: What ``batches(as_torch=True)`` yields: a :data:`Batch` whose arrays are CPU tensors over the
#: same memory.
TensorBatch: TypeAlias = "dict[str, torch.Tensor]"


@dataclass(frozen=True)
class FieldSpec:
    """One stored field: per-transition ``shape`` and ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.str}


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if shape is None:
        return ()
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if (
        isinstance(shape, (str, bytes))
        or not hasattr(shape, "__iter__")
        or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape)
    ):
        raise TypeError(f"env_dict[{name!r}]['shape']: expected an int or a tuple of ints, got {shape!r}")
    dims = tuple(int(d) for d in shape)
    if any(d < 1 for d in dims):
        raise ValueError(f"env_dict[{name!r}]['shape']: every dimension must be >= 1, got {dims}")
    return dims


def _dtype(name: str, dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"env_dict[{name!r}]['dtype']: {dtype!r} is not a numpy dtype") from None
    if dt.kind not in "biufc":
        raise TypeError(
            f"env_dict[{name!r}]['dtype']: expected a bool, integer or float dtype, or a complex one, got {dt}"
        )
    return dt.newbyteorder("=")


_RESERVED = {"indexes", "weights", "priorities", "timeout"}
_OPTIONS = {"shape", "dtype", "add_shape"}


def _check_add_shape(name: str, add_shape: Any, shape: tuple[int, ...]) -> None:
    """cpprb writes ``add_shape`` (``[-1, *shape]``, shape 1 for a scalar) into the env_dict
    it is given; the same dict is accepted here when that entry agrees with ``shape``."""
    try:
        given = [int(d) for d in np.asarray(add_shape).reshape(-1)]
    except (TypeError, ValueError):
        given = None
    if given not in ([-1, *shape], [-1, *(shape or (1,))]):
        raise ValueError(
            f"env_dict[{name!r}]['add_shape']: expected [-1, *shape] = {[-1, *(shape or (1,))]} "
            f"(cpprb's entry for shape {shape}), got {add_shape!r}"
        )


def parse_env_dict(env_dict: EnvDict, default_dtype: Any = None) -> dict[str, FieldSpec]:
    """Normalise a cpprb-style ``env_dict`` into ordered field specs.

    A missing ``shape`` means a scalar per transition; a missing ``dtype``
    means ``default_dtype`` (float32 when that is None too).  The
    ``add_shape`` entry cpprb adds to the dicts it is given is accepted when
    it agrees with ``shape``.  ``env_dict`` itself is never changed.
    """
    if not isinstance(env_dict, Mapping) or not env_dict:
        raise ValueError("env_dict: expected a non-empty mapping of field name -> {'shape': ..., 'dtype': ...}")
    default = np.float32 if default_dtype is None else default_dtype
    specs: dict[str, FieldSpec] = {}
    for name, given in env_dict.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"env_dict: field names must be identifiers, got {name!r}")
        if name in _RESERVED:
            raise ValueError(f"env_dict: {name!r} is reserved for sample()/add() keywords")
        options = {} if given is None else given
        if not isinstance(options, Mapping):
            raise TypeError(f"env_dict[{name!r}]: expected a mapping, got {type(options).__name__}")
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"env_dict[{name!r}]: unknown options {sorted(unknown)}; expected 'shape' and 'dtype'")
        shape = _shape(name, options.get("shape"))
        if "add_shape" in options:
            _check_add_shape(name, options["add_shape"], shape)
        specs[name] = FieldSpec(name, shape, _dtype(name, options.get("dtype", default)))
    return specs


def _cast(spec: FieldSpec, value: np.ndarray) -> np.ndarray:
    """``value`` in ``spec.dtype``; refuse casts that change a value's kind or range."""
    src, dst = value.dtype, spec.dtype
    if src == dst:
        return value
    if src.kind in "biu" and dst.kind in "biu":
        # Integer literals arrive as int64: accept them wherever they fit.  The extremes are
        # compared as Python ints: numpy 1.x compares uint64 with int64 bounds in float64, where
        # 2**63 equals int64's max.
        lo, hi = (0, 1) if dst.kind == "b" else (int(np.iinfo(dst).min), int(np.iinfo(dst).max))
        if value.size and (int(value.min()) < lo or int(value.max()) > hi):
            raise ValueError(f"field {spec.name!r}: values out of range for dtype {dst} ([{lo}, {hi}])")
        return value.astype(dst)
    if not np.can_cast(src, dst, "same_kind"):
        raise TypeError(f"field {spec.name!r}: cannot safely cast {src} to {dst}")
    if not (dst.kind in "fc" and dst.itemsize < src.itemsize):
        return value.astype(dst)  # widening: nothing can overflow
    with np.errstate(over="ignore"):
        converted = value.astype(dst)
    # Only an infinite result may be an overflow: compare with the source only then.
    if not np.isfinite(converted).all() and not np.array_equal(np.isfinite(converted), np.isfinite(value)):
        raise ValueError(f"field {spec.name!r}: values overflow dtype {dst}")
    return converted


def convert_batch(specs: Mapping[str, FieldSpec], values: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
    """Check and convert one transition or a batch.

    Returns ``(k, rows)`` where each ``rows[name]`` has shape ``(k,) + shape``
    in the field's dtype.  A field whose value has exactly the field's shape
    is one transition; one extra leading dimension makes it a batch.  A field
    of shape ``(1,)`` (cpprb's scalar) also takes one number per transition:
    a scalar for one, a 1-D array of ``k`` for a batch.
    """
    unknown = [n for n in values if n not in specs]
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; expected fields {list(specs)}")
    missing = [n for n in specs if n not in values]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}; expected fields {list(specs)}")
    rows: dict[str, np.ndarray] = {}
    k, first = 0, None  # the batch length, and the field that set it
    for name, spec in specs.items():
        try:
            arr = np.asarray(values[name])
        except ValueError:
            raise ValueError(
                f"field {name!r}: ragged value, expected shape {spec.shape} or (batch,) + {spec.shape}"
            ) from None
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"field {name!r}: expected numbers, got dtype {arr.dtype}")
        nd = len(spec.shape)
        if arr.shape == spec.shape or (spec.shape == (1,) and arr.ndim == 0):
            arr = arr.reshape((1,) + spec.shape)
        elif spec.shape == (1,) and arr.ndim == 1:
            arr = arr.reshape(-1, 1)
        elif arr.ndim != nd + 1 or arr.shape[1:] != spec.shape:
            raise ValueError(f"field {name!r}: expected shape {spec.shape} or (batch,) + {spec.shape}, got {arr.shape}")
        if first is None:
            k, first = arr.shape[0], name
        elif arr.shape[0] != k:
            raise ValueError(f"field {name!r}: batch length {arr.shape[0]} disagrees with {k} of field {first!r}")
        rows[name] = _cast(spec, arr)
    return int(k), rows
