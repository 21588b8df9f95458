"""The ``.npz`` archives both transitions file readers take apart: opened, written, damage reported.

A file's bytes are untrusted: an archive is opened only once every member's
compression method is stored or deflated and its claimed size is one its
compressed bytes, inside the archive, can inflate to (readers allocate what a
member's ``.npy`` header says before reading its data, once the header agrees
with that size).  Whatever zipfile, zlib or numpy's header parser raise on bad
bytes becomes a :class:`TransitionFileError` naming the file.  Writing a path is
atomic: a temporary file in the same folder, flushed to disk, renamed over it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from io import BytesIO, TextIOBase
from typing import IO, TYPE_CHECKING, Any, Union

import numpy as np

from .writeback import fsync_folder

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

__all__ = [
    "NPY_HEADERS",
    "File",
    "TransitionFileError",
    "damaged",
    "open_archive",
    "quiet_npy_parser",
    "read_npy_header",
    "short",
    "write_archive",
]

# numpy's readers of a .npy header, by the format versions its savez writes.
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}

# The most bytes one compressed byte of a member holds, by zip compression method (deflate: 1032).
_INFLATION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}
# What zipfile, zlib and numpy's header parser raise on bytes that are not what they claim to be
# (the parser tokenizes the header, evaluates it as a literal and sorts its keys: an unclosed bracket
# is a TokenError, keys of mixed types a TypeError).
_DAMAGE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    struct.error,
    EOFError,
    OSError,
    KeyError,
    IndexError,
    ValueError,
    TypeError,
    SyntaxError,
    OverflowError,
    NotImplementedError,
    RuntimeError,
    tokenize.TokenError,
)

File = Union[str, "os.PathLike[str]", IO[bytes]]


@contextlib.contextmanager
def quiet_npy_parser() -> Iterator[None]:
    """Read ``.npy`` headers inside the block without the warnings of numpy's parser.

    numpy evaluates a header's text as a Python literal: a damaged one may hold an escape Python
    warns about (a SyntaxWarning from 3.12, on the user's screen), where what matters is the error
    the header then raises, which :func:`damaged` reports."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        yield


def read_npy_header(version: tuple[int, int], stream: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` from the ``.npy`` header of ``version`` (a key of
    :data:`NPY_HEADERS`) at ``stream`` (see :func:`quiet_npy_parser`)."""
    with quiet_npy_parser():
        return NPY_HEADERS[version](stream)


class TransitionFileError(ValueError):
    """The file is not a valid transitions file, or does not fit the buffer."""


# -- writing -----------------------------------------------------------------------------------


def write_archive(file: File, arrays: dict[str, np.ndarray], compress: bool) -> None:
    """Write ``arrays`` (member name -> array) as an ``.npz`` archive to ``file`` (a path,
    written atomically, or a binary file object); ``compress`` deflates the members."""

    def write(f: IO[bytes]) -> None:
        _write_members(f, arrays, compress)

    if _is_path(file):
        _write_atomically(os.fsdecode(file), write)
    else:
        _check_binary(file, "write")
        write(file)


def _write_members(f: IO[bytes], arrays: dict[str, np.ndarray], compress: bool) -> None:
    # What np.savez does, minus its keyword arguments: a field named 'file'
    # or 'allow_pickle' would collide with them.
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(f, "w", compression=method, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def _write_atomically(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """``write`` to a new file in ``path``'s folder, sync it, then rename it to ``path``:
    a crash never leaves a partial file under the final name."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
        try:
            # Mode 0o666 lets the umask decide, as for any new file.
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):  # makes the rename durable; not every platform opens folders
        fsync_folder(folder)


# -- reading -----------------------------------------------------------------------------------


@contextlib.contextmanager
def damaged(problem: str, *, label: str = "file") -> Iterator[None]:
    """Report any failure to parse an archive inside the block (what zipfile, zlib and
    numpy's ``.npy`` header parser raise on bad bytes) as a :class:`TransitionFileError`
    ``"<label>: <problem> (<the error>)"``; other exceptions pass through."""
    try:
        yield
    except TransitionFileError:
        raise
    except _DAMAGE as exc:
        raise TransitionFileError(f"{label}: {problem} ({type(exc).__name__}: {exc})") from exc


def _is_path(file: Any) -> TypeIs[str | bytes | os.PathLike[str] | os.PathLike[bytes]]:
    return isinstance(file, (str, bytes, os.PathLike))


def _check_binary(file: Any, method: str) -> None:
    if not hasattr(file, method):
        raise TypeError(f"file: expected a path or a binary file object, got {type(file).__name__}")
    if isinstance(file, TextIOBase):
        raise TypeError("file: expected a binary file object, got a text-mode file (open it with 'rb' or 'wb')")


@contextlib.contextmanager
def open_archive(file: File, *, label: str = "file") -> Iterator[zipfile.ZipFile]:
    """The ``.npz`` archive ``file`` (a path or a binary file object) opened for reading.

    Bytes that are no zip archive raise :class:`TransitionFileError` starting with
    ``label``; a missing file raises the ``OSError`` of ``open``, an object that is no
    binary file a ``TypeError``.
    """
    if _is_path(file):
        with open(file, "rb") as f, _zip(f, label) as archive:
            yield archive
    else:
        _check_binary(file, "read")
        with _zip(file, label) as archive:
            yield archive


@contextlib.contextmanager
def _zip(f: IO[bytes], label: str) -> Iterator[zipfile.ZipFile]:
    with damaged("not a readable .npz archive: damaged, truncated or another kind of file", label=label):
        # A zip is read from its end: a stream that cannot seek is read whole first.
        seekable = getattr(f, "seekable", None)
        if seekable is None or not seekable():
            f = BytesIO(f.read())
        archive = zipfile.ZipFile(f)
        size = f.seek(0, os.SEEK_END)  # the archive reads each member from its own offset
    with archive:
        _check_sizes(archive, size, label)
        yield archive


def _check_sizes(archive: zipfile.ZipFile, size: int, label: str) -> None:
    """Refuse a member that claims more bytes than the archive can hold.

    Readers allocate the array a member's ``.npy`` header says before reading its data,
    once the header agrees with the member's size in the zip's directory: that size must
    be one the member's compressed bytes can inflate to, and those must lie in the archive.
    """
    for info in archive.infolist():
        inflation = _INFLATION.get(info.compress_type)
        if inflation is None:
            raise TransitionFileError(
                f"{label}: member {short(info.filename)} uses zip compression method "
                f"{info.compress_type}; numpy's savez writes stored or deflated members"
            )
        if info.header_offset + info.compress_size > size or info.file_size > info.compress_size * inflation:
            raise TransitionFileError(
                f"{label}: member {short(info.filename)} claims {info.file_size} bytes in "
                f"{info.compress_size} compressed bytes at offset {info.header_offset}, "
                f"which a {size}-byte archive cannot hold"
            )


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
