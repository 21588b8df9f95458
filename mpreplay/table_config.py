"""A table's configuration: every part it is built from, checked together once.

:func:`TableConfig.build` takes what :class:`mpreplay.Table`'s constructor takes, checks each
option and every combination of them -- refusing an illegal one by the name of the argument the
caller wrote -- and returns the :class:`TableConfig` the table is assembled from.  A handle on the
same memory in another process is assembled from the same configuration (it pickles with the
handle), so the two cannot disagree on a part.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import checks, removers
from ._ext.schema import EPISODE_STEP_ARRAY
from .compression import Compression, with_next_fields
from .limiter import ExactlyOnce, RateLimiter
from .nstep import NstepArgs, nstep_args
from .nstep_stage import NstepStage
from .selectors import SelectorSpec
from .sequences import SequenceSpec
from .spec import EnvDict, FieldSpec, parse_env_dict

if TYPE_CHECKING:  # numpy's union, shown by name in signatures and the reference
    from numpy.typing import DTypeLike

__all__ = ["EPISODE_STEP", "TableConfig"]

# The field a sequence table gives each step's index in its episode (in samples, snapshots, files):
# its array's name, which samples hand out as one more field.
EPISODE_STEP = EPISODE_STEP_ARRAY


@dataclass(frozen=True)
class TableConfig:
    """The parts of a table, checked (see :meth:`TableConfig.build`)."""

    size: int
    specs: dict[str, FieldSpec]  # the fields as stored and sampled (n-step rows' when folded, next_<key> added)
    selector: SelectorSpec
    remover: str  # an entry of mpreplay.removers
    max_times_sampled: int | None
    compression: Compression | None  # compressed keys, or a sequence table's lanes; None: rows in one lane
    sequence: SequenceSpec | None
    nstep: NstepArgs | None  # each writer folds its own steps with these
    shared: bool  # in a shared-memory segment (else in this process's memory)
    mmap_prefix: str | None  # a local table's arrays in files of this prefix
    float32_weights: bool  # sample hands importance weights out as float32 (else float64)
    uint64_indexes: bool  # sample hands indexes out as uint64 (else int64)
    persist: bool = False  # a shared table that outlives its creator (until removed)

    @classmethod
    def build(
        cls,
        size: Any,
        env_dict: EnvDict,
        *,
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        shared: bool = False,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        sequence: SequenceSpec | None = None,
        default_dtype: DTypeLike | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        cpprb_nstep: Any = None,
    ) -> TableConfig:
        """Check a table's options, alone and together; ValueError or TypeError naming the
        argument (the one the caller wrote: a Queue's own choices are refused as the Queue's)."""
        size = checks.capacity("size", size)
        shared = checks.flag("shared", shared)
        if checks.flag("persist", persist) and not shared:
            raise ValueError(
                "persist: only a shared table outlives the process that made it; build it with shared=True "
                "(or an MP class)"
            )
        if sequence is not None and not isinstance(sequence, SequenceSpec):
            raise TypeError(f"sequence: expected a SequenceSpec or None, got {type(sequence).__name__}")
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise TypeError(
                    f"rate_limiter: expected MinSize, SampleToInsertRatio, Queue, Stack or RateLimiter, "
                    f"got {type(rate_limiter).__name__}"
                )
            if isinstance(rate_limiter, ExactlyOnce):
                selector, max_times_sampled, remover = rate_limiter.buffer_options(
                    selector, max_times_sampled, remover, prioritized=False, sequences=sequence is not None
                )
            rate_limiter.check(size)
        selector_spec = SelectorSpec.of("uniform" if selector is None else selector)
        remover = removers.entry("fifo" if remover is None else remover).name
        if max_times_sampled is not None:
            max_times_sampled = checks.integer("max_times_sampled", max_times_sampled, low=1)
        compressed = next_of is not None or stack_compress is not None
        if sequence is not None:
            if max_times_sampled is not None:
                raise ValueError("max_times_sampled: a sequence buffer's items are sequences; it does not retire them")
            if not removers.entry(remover).overwrites:
                raise ValueError(
                    f"remover: a sequence buffer takes no {remover!r} remover: its items are sequences, which "
                    "no sample retires, so its writes would wait for ever"
                )
            if nstep is not None:
                raise ValueError(
                    "nstep: a sequence buffer stores single steps; compute n-step targets inside the sampled sequences"
                )
            if EPISODE_STEP in env_dict:
                raise ValueError(
                    f"env_dict: {EPISODE_STEP!r} is the name a sequence buffer gives each step's index in its "
                    "episode; call the field something else"
                )
        if not removers.entry(remover).overwrites and max_times_sampled is None:
            raise ValueError(
                f"remover: {remover!r} never replaces an unread item, and without max_times_sampled= no sample "
                "retires one, so once full every write would wait for ever: give max_times_sampled= (a Queue "
                "or a Stack has 1) or another remover"
            )
        if (compressed or sequence is not None) and not removers.entry(remover).frames:
            framed = [n for n in removers.names() if removers.entry(n).frames]
            raise ValueError(
                f"remover: {remover!r} replaces the newest rows, whose frames an episode's next steps read; a "
                f"compressed or sequence buffer takes {framed}"
            )
        if mmap_prefix is not None:
            if not isinstance(mmap_prefix, (str, os.PathLike)):
                raise TypeError(f"mmap_prefix: expected a path prefix (str) or None, got {type(mmap_prefix).__name__}")
            if shared:
                raise ValueError(
                    "mmap_prefix: a shared buffer lives in a shared-memory segment; only local buffers "
                    "map their arrays to files"
                )
        folding = nstep_args(env_dict, default_dtype, nstep, cpprb_nstep)
        # The fields as given (before folding or next_<key>), every dtype spelt out, and the
        # default dtype's name: plain values a process given only the table's name builds from.
        given = {
            s.name: {"shape": list(s.shape), "dtype": s.dtype.str}
            for s in parse_env_dict(env_dict, default_dtype).values()
        }
        default = _dtype_name(default_dtype)
        if folding is not None:
            folding = (given, default, _plain(folding[2]))  # the same folder in every process
        rows = env_dict if folding is None else NstepStage(folding, False).rows.output_env_dict()
        specs = with_next_fields(parse_env_dict(rows, default_dtype), next_of)
        compression = Compression.build(
            specs,
            next_of,
            stack_compress,
            lanes,
            "done" if "done" in specs else None,
            "truncated" if "truncated" in specs else None,
            in_lanes=sequence is not None,
        )
        if sequence is not None:
            assert compression is not None  # a sequence table always keeps its steps in lanes
            width = size // compression.lanes
            if width < sequence.length:
                raise ValueError(
                    f"length: a sequence of {sequence.length} steps does not fit in a lane of {width} steps "
                    f"(size {size}, lanes {compression.lanes})"
                )
        weights = checks.dtype("weights_dtype", weights_dtype, (np.float64, np.float32))
        indexes = checks.dtype("indexes_dtype", indexes_dtype, (np.int64, np.uint64))
        return cls(
            size=size,
            specs=specs,
            selector=selector_spec,
            remover=remover,
            max_times_sampled=max_times_sampled,
            compression=compression,
            sequence=sequence,
            nstep=folding,
            shared=shared,
            mmap_prefix=None if mmap_prefix is None else os.fspath(mmap_prefix),
            float32_weights=weights == np.float32,
            uint64_indexes=indexes == np.uint64,
            persist=persist,
        )

    @property
    def arguments(self) -> dict[str, object]:
        """The arguments of :meth:`build` that make this configuration, as JSON values: what a
        shared table's manifest carries, so that a process given only the table's name builds
        the same configuration (:meth:`from_arguments`)."""
        c, seq = self.compression, self.sequence
        if self.nstep is None:  # the fields as stored, next_<key> included: build adds none then
            fields, default, nstep = self.specs, None, None
        else:  # the fields before folding, and how they fold
            env_dict, default, nstep = self.nstep
            fields = parse_env_dict(env_dict, default)
        arguments: dict[str, object] = _plain(
            {
                "size": self.size,
                "env_dict": {s.name: {"shape": list(s.shape), "dtype": s.dtype.str} for s in fields.values()},
                "selector": {"name": self.selector.name, **dict(self.selector.options)},
                "remover": self.remover,
                "max_times_sampled": self.max_times_sampled,
                "nstep": nstep,
                "next_of": None if c is None else list(c.next_of) or None,
                "stack_compress": None if c is None else list(c.stack) or None,
                "lanes": 1 if c is None else c.lanes,
                "sequence": None
                if seq is None
                else {"length": seq.length, "period": seq.period, "pad_end": seq.pad_end, "eta": seq.eta},
                "default_dtype": _dtype_name(default),
                "weights_dtype": np.dtype(np.float32 if self.float32_weights else np.float64).str,
                "indexes_dtype": np.dtype(np.uint64 if self.uint64_indexes else np.int64).str,
            }
        )
        return arguments

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, object], *, persist: bool) -> TableConfig:
        """The shared table's configuration that ``arguments`` (read from its manifest) describe."""
        args: dict[str, Any] = dict(arguments)
        selector = args.pop("selector")
        sequence = args.pop("sequence")
        return cls.build(
            **args,
            selector=SelectorSpec(**selector),
            sequence=None if sequence is None else SequenceSpec.build(**sequence),
            shared=True,
            persist=persist,
        )

    @property
    def by_priority(self) -> bool:
        """Whether the selector draws by the priorities given (``add(priorities=)``,
        ``update_priorities``, importance weights)."""
        return self.selector.entry.by_priority


def _dtype_name(dtype: Any) -> str | None:
    """``dtype`` as numpy writes it; None for None, and for what is no dtype (refused by the field
    that takes it, where one does; a default no field takes is never used)."""
    try:
        return None if dtype is None else np.dtype(dtype).str
    except TypeError:
        return None


def _plain(value: Any) -> Any:
    """``value`` with every numpy scalar and tuple in it made the Python value JSON writes."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value
