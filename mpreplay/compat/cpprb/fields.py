"""cpprb's field conventions, translated to and from mpreplay's.

cpprb gives every field a shape, ``1`` when none is named, so a scalar field
comes back from ``sample`` with shape ``(batch, 1)``; and it reshapes whatever
``add`` receives to ``(-1, *shape)``.  The native buffers store such a field
with that shape, ``(1,)`` (their fast path takes a number or a 0-d array for it),
so samples come out in cpprb's shapes as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...spec import FieldSpec, convert_batch, parse_env_dict

__all__ = ["Fields", "option_names"]


def _cpprb_shape(shape: Any) -> tuple[int, ...] | None:
    """A cpprb ``shape`` entry as a tuple of ints, or None when it is not one (the
    native parser then names what is wrong with it)."""
    try:
        dims = np.asarray(shape).reshape(-1)
    except (TypeError, ValueError):
        return None
    if dims.dtype.kind not in "iu":
        return None
    return tuple(int(d) for d in dims)


@dataclass(frozen=True)
class Fields:
    """The fields of a cpprb ``env_dict``, in cpprb's shapes (``(1,)`` where none is named)."""

    specs: dict[str, FieldSpec]

    @classmethod
    def parse(cls, env_dict: Mapping[str, object] | None, default_dtype: Any = None, next_of: Any = None) -> Fields:
        """Parse a cpprb ``env_dict`` (never changing it); ``next_of`` adds ``next_<key>``
        for each key, as cpprb does."""
        if not isinstance(env_dict, Mapping) or not env_dict:
            raise ValueError(
                "env_dict: expected a non-empty mapping of field name -> "
                "{'shape': ..., 'dtype': ...} (a buffer without fields stores nothing)"
            )
        native: dict[str, Any] = {}  # each a spec dict, or what was given, for parse_env_dict to refuse
        for name, given in env_dict.items():
            options = dict(given) if isinstance(given, Mapping) else given
            if isinstance(options, dict):
                shape = _cpprb_shape(options.get("shape", 1))
                if shape is not None:
                    options["shape"] = shape
            native[name] = options
        for key in option_names("next_of", next_of):
            if key not in native:
                raise ValueError(f"next_of: {key!r} is not a field of env_dict (fields {list(native)})")
            native.setdefault(f"next_{key}", native[key])
        return cls(parse_env_dict(native, default_dtype))

    def env_dict(self) -> dict[str, dict[str, Any]]:
        """The native env_dict of these fields."""
        return {name: {"shape": s.shape, "dtype": s.dtype} for name, s in self.specs.items()}

    def pick(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values of these fields: keys of no field are ignored, a missing one raises
        KeyError (cpprb's rules for ``add``)."""
        missing = [name for name in self.specs if name not in values]
        if missing:
            raise KeyError(f"add: missing field {missing[0]!r}; expected fields {list(self.specs)}")
        return {name: values[name] for name in self.specs}

    def rows(self, values: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """``(k, rows)`` of ``values`` (one value per field), converted as mpreplay's ``add``
        converts them after cpprb's reshape to ``(-1, *shape)``: one transition or a batch,
        in any layout whose size is a whole number of rows."""
        return convert_batch(self.specs, {name: self.reshaped(name, values[name]) for name in self.specs})

    def reshaped(self, name: str, value: Any) -> Any:
        """``value`` of field ``name`` as ``(k, *shape)`` when it is laid out otherwise."""
        shape = self.specs[name].shape
        try:
            arr = np.asarray(value)
        except ValueError:
            return value  # ragged: convert_batch names the field
        if arr.shape == shape or arr.shape[1:] == shape:
            return arr
        width = int(np.prod(shape, dtype=np.int64))
        if arr.size % width:
            return arr  # no whole number of rows: convert_batch names the field and the shapes
        return arr.reshape((-1,) + shape)

    def reshaped_all(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every value (one per field) as :meth:`reshaped` lays it out."""
        return {name: self.reshaped(name, v) for name, v in values.items()}


def option_names(option: str, value: Any) -> tuple[str, ...]:
    """A cpprb option naming one field or several (a string or a list of strings)."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(np.asarray(value).reshape(-1).tolist())
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{option}: expected a field name or a list of field names, got {value!r}")
    return names
