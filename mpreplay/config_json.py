"""A table's configuration as JSON and back: what a checkpoint records so that restoring it
rebuilds the same table without unpickling anything.

:func:`to_json` writes every part of a :class:`~mpreplay.table_config.TableConfig` as plain
JSON values (dtypes as their ``str``, shapes as lists); :func:`from_json` builds the config
again, each part through its own constructor, so a document that names an unknown selector,
remover or dtype is refused as those constructors refuse it.  The caller compares the layout
the rebuilt config computes with the one recorded: a config that passes that check is the one
the arrays were laid out for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import removers
from .compression import Compression
from .selectors import SelectorSpec
from .sequences import SequenceSpec
from .spec import FieldSpec, parse_env_dict
from .table_config import TableConfig

__all__ = ["from_json", "to_json"]


def to_json(config: TableConfig) -> dict[str, Any]:
    """``config`` as a JSON-serialisable document."""
    c, seq = config.compression, config.sequence
    nstep = None
    if config.nstep is not None:
        env_dict, default_dtype, settings = config.nstep
        # Normalised, so that no dtype object has to be written: the folder parses it the same.
        specs = parse_env_dict(env_dict, default_dtype)
        nstep = {
            "env_dict": [spec.to_json() for spec in specs.values()],  # a list: the fields' order is kept
            "settings": {
                "size": int(settings["size"]),
                "gamma": float(settings["gamma"]),
                **{key: settings[key] for key in ("rew", "next", "done", "truncated")},
            },
        }
    return {
        "size": config.size,
        "specs": [spec.to_json() for spec in config.specs.values()],
        "selector": {"name": config.selector.name, "options": dict(config.selector.options)},
        "remover": config.remover,
        "max_times_sampled": config.max_times_sampled,
        "compression": None
        if c is None
        else {
            "next_of": list(c.next_of),
            "stack": list(c.stack),
            "lane_count": c.lanes,
            "done": c.done,
            "truncated": c.truncated,
        },
        "sequence": None
        if seq is None
        else {"length": seq.length, "period": seq.period, "pad_end": seq.pad_end, "eta": seq.eta},
        "nstep": nstep,
        "shared": config.shared,
        "mmap_prefix": config.mmap_prefix,
        "float32_weights": config.float32_weights,
        "uint64_indexes": config.uint64_indexes,
    }


def from_json(doc: dict[str, Any], *, shared: bool) -> TableConfig:
    """The config ``doc`` (from :func:`to_json`) describes, in shared memory or not as ``shared``
    says (a shared table maps no files: ``mmap_prefix`` is dropped then).  KeyError, TypeError
    or ValueError for a document that is not one."""
    c, seq, nstep = doc["compression"], doc["sequence"], doc["nstep"]
    specs = {
        str(s["name"]): FieldSpec(str(s["name"]), tuple(int(d) for d in s["shape"]), np.dtype(s["dtype"]))
        for s in doc["specs"]
    }
    return TableConfig(
        size=int(doc["size"]),
        specs=specs,
        selector=SelectorSpec(str(doc["selector"]["name"]), **doc["selector"]["options"]),
        remover=removers.entry(str(doc["remover"])).name,
        max_times_sampled=None if doc["max_times_sampled"] is None else int(doc["max_times_sampled"]),
        compression=None
        if c is None
        else Compression(tuple(c["next_of"]), tuple(c["stack"]), int(c["lane_count"]), c["done"], c["truncated"]),
        sequence=None
        if seq is None
        else SequenceSpec(int(seq["length"]), int(seq["period"]), bool(seq["pad_end"]), float(seq["eta"])),
        nstep=None
        if nstep is None
        else (
            {str(s["name"]): {"shape": tuple(s["shape"]), "dtype": s["dtype"]} for s in nstep["env_dict"]},
            None,
            dict(nstep["settings"]),
        ),
        shared=shared,
        mmap_prefix=None if shared else doc["mmap_prefix"],
        float32_weights=bool(doc["float32_weights"]),
        uint64_indexes=bool(doc["uint64_indexes"]),
    )
