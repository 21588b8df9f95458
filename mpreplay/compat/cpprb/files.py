"""The files a cpprb buffer loads: mpreplay's transitions files, and the ones cpprb writes.

``load_transitions`` takes either: a file of mpreplay's format
(:mod:`mpreplay.fileformat`), or one cpprb's ``save_transitions`` wrote, read
without unpickling anything (:mod:`mpreplay.compat.cpprb_files`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ... import fileformat
from ..cpprb_files import read_cpprb_file
from .fields import Fields

__all__ = ["read_rows"]


def read_rows(file: Any, fields: Fields, nstep: tuple[int, float] | None) -> tuple[int, dict[str, np.ndarray]]:
    """``(count, rows)``: the transitions of ``file`` as rows of ``fields``, for a buffer whose rows are
    folded with ``nstep`` (``(n, gamma)``, None: not folded).  Raises ValueError for a file of
    other fields or n-step settings, or anything else."""
    try:
        fileformat.read_metadata(file)
    except fileformat.TransitionFileError as own:
        _rewind(file)
        try:
            theirs = read_cpprb_file(file)
        except ValueError as error:
            raise ValueError(
                f"load_transitions: neither a transitions file of mpreplay ({own}) nor one of cpprb ({error})"
            ) from None
        folded = nstep is not None
        if theirs.nstep != folded:
            raise ValueError(
                f"load_transitions: the file's rows were {'' if theirs.nstep else 'not '}folded "
                f"over n steps, this buffer's are {'' if folded else 'not'}"
            ) from None
        try:
            return fields.rows(fields.pick(theirs.transitions))
        except KeyError as missing:
            raise ValueError(f"load_transitions: the file lacks a field: {missing}") from None
    _rewind(file)
    rows, _ = fileformat.read_transitions(file, fields.specs, nstep=nstep)
    return len(next(iter(rows.values()))), rows


def _rewind(file: Any) -> None:
    if not isinstance(file, (str, bytes, os.PathLike)):
        file.seek(0)
