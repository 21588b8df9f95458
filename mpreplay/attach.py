"""Join a shared table by name: :func:`attach`, from any process of the table's user.

A shared table's segment describes itself (:mod:`mpreplay.manifest`): its class, its checked
constructor arguments and its layout.  A process given only the name reads them, builds the
same configuration, and maps the segment as an unpickled handle does -- checking the layout it
computes against the one the segment holds.  See docs/processes.md.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any

from . import checks, manifest
from .errors import IncompatibleSegmentError
from .memory import SHM_DIR, SharedMemoryError, segment_name
from .table import Table
from .table_assembly import attach as attach_segment
from .table_config import TableConfig

__all__ = ["attach"]

# Seconds between two looks for a table that does not exist yet.
_POLL = 0.02


def attach(name: str, *, readonly: bool = False, timeout: float | None = None) -> Table:
    """A handle on the shared table called ``name``, of the table's own class: the same API as
    its creator's, with its own random stream.

    ``name`` is what the creator passed as ``Table(..., name=)`` or the table's ``name``
    (``mpreplay ls`` lists them).  A table that does not exist yet is waited for, ``timeout``
    seconds at most (None: no limit; 0: not at all), then :class:`~mpreplay.SharedMemoryError`
    names it.  A table made by another minor version of mpreplay, or whose layout this process
    would compute otherwise, is refused with :class:`~mpreplay.IncompatibleSegmentError`; one
    of another user with :class:`~mpreplay.SharedMemoryError`.

    ``readonly``: the handle samples, reads and inspects, and its ``add``,
    ``update_priorities``, ``clear``, ``on_episode_end`` (every call that writes) raise
    :class:`~mpreplay.ReadOnlyError`; it never claims a lane nor counts as a writer.

    The handle is released by ``close()``; ``close(unlink=True)`` removes a persistent table.

    Examples
    --------
    >>> import mpreplay
    >>> table = mpreplay.Table(100, {"obs": {}}, shared=True, name="doc-attach")
    >>> table.add(obs=1.0)
    0
    >>> reader = mpreplay.attach("doc-attach", readonly=True, timeout=0)  # in any process
    >>> type(reader).__name__, reader.get_stored_size()
    ('Table', 1)
    >>> reader.close(); table.close()
    """
    segment = segment_name(checks.table_name("name", name))
    readonly = checks.flag("readonly", readonly)
    timeout = checks.seconds("timeout", timeout)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    while (document := _manifest_of(segment)) is None:
        if deadline is not None and time.monotonic() >= deadline:
            raise _missing(name, segment, deadline - start)
        time.sleep(_POLL if deadline is None else max(0.0, min(_POLL, deadline - time.monotonic())))
    cls = _table_class(segment, document["class"])
    try:
        config = TableConfig.from_arguments(document["build"], persist=document["persist"])
    except (TypeError, ValueError) as exc:
        raise IncompatibleSegmentError(
            f"{segment}: its manifest's constructor arguments are refused ({exc}); refusing to attach"
        ) from None
    return attach_segment(cls, config, segment, readonly)


def _manifest_of(segment: str) -> dict[str, Any] | None:
    """The manifest of ``segment`` once it is there; None while the segment does not exist or
    is still being made."""
    try:
        fd = os.open(os.path.join(SHM_DIR, segment), os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise SharedMemoryError(
            f"name: table {segment!r} belongs to another user: only its owner's processes may map it"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < manifest.NBYTES:
            return None
        return manifest.readable(segment, os.pread(fd, manifest.NBYTES, 0), st.st_size)
    finally:
        os.close(fd)


def _missing(name: str, segment: str, timeout: float) -> SharedMemoryError:
    """The error of a table that did not appear within ``timeout`` seconds (0: looked once)."""
    waited = "" if timeout == 0 else f" within {timeout:g} s"
    if os.path.exists(os.path.join(SHM_DIR, segment)):
        return IncompatibleSegmentError(f"{segment}: holds no replay table{waited} (no manifest); refusing to attach")
    return SharedMemoryError(
        f"name: no table called {name!r} ({SHM_DIR}/{segment}) appeared{waited}; mpreplay ls lists the tables"
    )


def _table_class(segment: str, class_name: str) -> type[Table]:
    """The class called ``class_name`` among the tables this process knows (mpreplay's own
    first: a program's class of the same name does not shadow them)."""
    known: list[type[Table]] = [Table]
    for cls in known:
        known.extend(sub for sub in cls.__subclasses__() if sub not in known)
    found = sorted(
        (cls for cls in known if cls.__name__ == class_name), key=lambda c: not c.__module__.startswith("mpreplay.")
    )
    if not found:
        raise IncompatibleSegmentError(
            f"{segment}: holds a {class_name}, a table class this process does not know; import the module "
            "that defines it before attaching"
        )
    return found[0]
