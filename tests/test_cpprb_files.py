"""Specification of mpreplay.compat.cpprb_files: files written by cpprb's save_transitions, read without running code.

The tests against the real cpprb need it installed (the ``test`` extra has it below Python 3.13, where cpprb
has wheels); without it they skip.
Files in the layout of cpprb 10.1 with numpy 1.x (the oldest cpprb files) are built here by hand: the
same six members cpprb's ``save_transitions`` passes to ``np.savez_compressed``, pickled with protocol 3
and numpy 1's module names, which is what the files in cpprb's own ``test/v1`` folder hold.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import pickletools
import shlex
import zipfile
from pathlib import Path
from typing import Any

import damage  # tests/damage.py: files taken apart and put together
import numpy as np
import pytest
from helpers import cpprb_buffer, saved_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpreplay.compat.cpprb_files import read_cpprb_file, read_cpprb_transitions
from mpreplay.fileformat import TransitionFileError

# -- files written the way cpprb writes them ----------------------------------------------------


def _object_header() -> bytes:
    """The ``.npy`` header of a 0-d object array: its pickle follows."""
    return damage.npy_header("|O", ())


def _object_npy(held: Any, *, numpy1: bool = False) -> bytes:
    """A member holding ``held`` as numpy saves any non-array: a pickled 0-d object array.

    ``numpy1``: pickled as numpy 1.x did (protocol 3, ``numpy.core.multiarray``).
    """
    wrapper = np.empty((), dtype=object)
    wrapper[()] = held
    if not numpy1:
        stream = io.BytesIO()
        np.lib.format.write_array(stream, wrapper, allow_pickle=True)
        return stream.getvalue()
    # Protocol 3 names globals as text lines, so the module can be renamed in place.
    raw = pickle.dumps(wrapper, protocol=3).replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    return _object_header() + raw


def _pickle_of(npy: bytes) -> bytes:
    """The pickle of an object member, after its ``.npy`` header."""
    header = _object_header()
    assert npy.startswith(header)
    return npy[len(header) :]


def _members(
    data: Any,
    *,
    safe: bool = True,
    nstep: bool = False,
    cache: Any = None,
    next_of: Any = None,
    version: Any = 1,
    numpy1: bool = False,
) -> dict[str, bytes]:
    """The members of ``np.savez_compressed(file, safe=, version=, data=, Nstep=, cache=, next_of=)``,
    the call cpprb's save_transitions makes (``next_of``, when not None, is a list of names: cpprb
    passes them as a numpy unicode array, which numpy saves without pickling)."""
    return {
        "safe": damage.npy_bytes(safe),
        "version": damage.npy_bytes(version),
        "data": _object_npy(data, numpy1=numpy1),
        "Nstep": damage.npy_bytes(nstep),
        "cache": _object_npy(cache, numpy1=numpy1),
        "next_of": _object_npy(None, numpy1=numpy1)
        if next_of is None
        else damage.npy_bytes(np.array(next_of, ndmin=1)),
    }


def _archive(members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """An archive of cpprb's ``members``, each stored as ``<name>.npy`` (as ``np.savez`` names them)."""
    return damage.zip_archive({f"{name}.npy": raw for name, raw in members.items()}, compression)


def _file(data: Any, **kwargs: Any) -> io.BytesIO:
    return io.BytesIO(_archive(_members(data, **kwargs)))


def _with(member: str, raw: bytes, data: Any = None, **kwargs: Any) -> io.BytesIO:
    """A valid file (of ``data`` and ``kwargs``) whose member ``member`` is replaced by ``raw``."""
    members = _members({"a": np.zeros((2, 1), np.float32)} if data is None else data, **kwargs)
    members[member] = raw
    return io.BytesIO(_archive(members))


def _f4(*rows: Any) -> np.ndarray:
    return np.array(rows, dtype=np.float32).reshape(len(rows), -1)


def _globals(npy: bytes) -> set[str]:
    """The globals a pickled member names (read with pickletools, which runs nothing)."""
    return {arg for op, arg, _ in pickletools.genops(_pickle_of(npy)) if op.name == "GLOBAL"}


def _assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Same names in the same order, and per field the same dtype, shape and values."""
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


# -- files written by the real cpprb ------------------------------------------------------------

NSTEP = {"size": 3, "gamma": 0.9, "rew": "rew"}
OPTIONS = {
    "plain": {},
    "next_of": {"next_of": "obs"},
    "stack_compress": {"stack_compress": "obs"},
    "next_of+stack_compress": {"next_of": "obs", "stack_compress": "obs"},
    "Nstep": {"Nstep": NSTEP},
    "Nstep+stack_compress": {"Nstep": NSTEP, "stack_compress": "obs"},
    "Nstep+next_of": {"Nstep": {**NSTEP, "next": "obs"}, "next_of": "obs"},  # cpprb drops next_of here
}
# What happens to a buffer of 8 before it is saved: k steps added, or "end" (on_episode_end).
HISTORIES = {
    "empty": [],
    "partial": [5],
    "episodes": [3, "end", 4, "end"],
    "wrapped": [4, "end", 6, "end", 3],
}


@pytest.fixture(scope="module")
def cpprb() -> Any:
    return pytest.importorskip(
        "cpprb", reason="cpprb is not installed (the test extra has it where it has wheels: Python < 3.13)"
    )


@pytest.mark.parametrize("safe", [True, False], ids=["safe", "unsafe"])
@pytest.mark.parametrize("history", list(HISTORIES))
@pytest.mark.parametrize("options", list(OPTIONS))
def test_reads_what_get_all_transitions_of_the_saving_cpprb_buffer_returned(cpprb, options, history, safe):
    buffer = cpprb_buffer(cpprb, OPTIONS[options], HISTORIES[history])
    expected = buffer.get_all_transitions()
    _assert_same(read_cpprb_transitions(saved_file(buffer, safe=safe)), expected)


def test_reports_the_layout_and_the_nstep_flag_of_a_cpprb_file(cpprb):
    flags = {}
    for name in ("plain", "Nstep", "next_of"):
        for safe in (True, False):
            read = read_cpprb_file(saved_file(cpprb_buffer(cpprb, OPTIONS[name], [3]), safe=safe))
            flags[name, safe] = (read.safe, read.nstep)
    # cpprb writes the safe layout whenever there is nothing to compress.
    assert flags == {
        ("plain", True): (True, False),
        ("plain", False): (True, False),
        ("Nstep", True): (True, True),
        ("Nstep", False): (True, True),
        ("next_of", True): (True, False),
        ("next_of", False): (False, False),
    }


def test_reads_a_file_of_a_prioritized_cpprb_buffer(cpprb):
    buffer = cpprb_buffer(cpprb, OPTIONS["next_of+stack_compress"], HISTORIES["wrapped"], cls="PrioritizedReplayBuffer")
    expected = buffer.get_all_transitions()
    _assert_same(read_cpprb_transitions(saved_file(buffer, safe=False)), expected)


@pytest.mark.parametrize("options", ["next_of", "next_of+stack_compress"])
def test_reads_a_cpprb_buffer_kept_in_mmap_files(cpprb, tmp_path, options):
    # Its arrays are numpy memmaps, which pickle as numpy.memmap.
    buffer = cpprb_buffer(cpprb, OPTIONS[options], HISTORIES["wrapped"], mmap_prefix=str(tmp_path / "rb"))
    expected = buffer.get_all_transitions()
    buffer.save_transitions(tmp_path / "rb.npz", safe=False)
    _assert_same(read_cpprb_transitions(tmp_path / "rb.npz"), expected)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.integers(1, 6),
    options=st.sampled_from(list(OPTIONS)),
    safe=st.booleans(),
    history=st.lists(st.one_of(st.integers(1, 6), st.just("end")), max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_history_of_a_cpprb_buffer_reads_back_as_get_all_transitions(cpprb, size, options, safe, history, seed):
    # cpprb wraps a batch around its ring at most once: no batch exceeds the size.
    history = [operation if operation == "end" else min(operation, size) for operation in history]
    buffer = cpprb_buffer(cpprb, OPTIONS[options], history, size=size, seed=seed)
    expected = buffer.get_all_transitions()
    _assert_same(read_cpprb_transitions(saved_file(buffer, safe=safe)), expected)


# -- files of cpprb 10.1 with numpy 1.x ---------------------------------------------------------
# The cases of cpprb's test/v1 files: the members as those files hold them, the transitions as
# get_all_transitions() returned them.

V1_CASES = {
    "basic": ({"data": {"a": _f4(1, 2, 3, 4)}}, {"a": _f4(1, 2, 3, 4)}),
    "Nstep": ({"data": {"done": _f4(0, 0, 0, 1, 1)}, "nstep": True}, {"done": _f4(0, 0, 0, 1, 1)}),
    "next_of": (
        {"data": {"a": _f4(1, 2, 3, 4, 5), "next_a": _f4(2, 3, 4, 5, 6)}},
        {"a": _f4(1, 2, 3, 4, 5), "next_a": _f4(2, 3, 4, 5, 6)},
    ),
    "unsafe_next_of": (
        {
            "data": {"a": _f4(1, 2, 3, 4, 5)},
            "safe": False,
            "next_of": ["a"],
            "cache": {3: {"next_a": _f4(5)[0]}, 4: {"next_a": _f4(6)[0]}},
        },
        {"a": _f4(1, 2, 3, 4, 5), "next_a": _f4(2, 3, 4, 5, 6)},
    ),
    # 12 transitions into 10 slots: slots 0 and 1 were overwritten, slot 9's next is slot 0.
    "fulled_unsafe_next_of": (
        {
            "data": {"a": _f4(11, 12, 3, 4, 5, 6, 7, 8, 9, 10)},
            "safe": False,
            "next_of": ["a"],
            "cache": {0: {"next_a": _f4(12)[0]}, 1: {"next_a": _f4(13)[0]}},
        },
        {"a": _f4(11, 12, 3, 4, 5, 6, 7, 8, 9, 10), "next_a": _f4(12, 13, 4, 5, 6, 7, 8, 9, 10, 11)},
    ),
    # cpprb keys the stacked fields of a cache entry by numpy.str_.
    "unsafe_next_of_stack_compress": (
        {
            "data": {"a": _f4([1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 7])},
            "safe": False,
            "next_of": ["a"],
            "cache": {
                2: {"next_a": _f4([4, 5, 6])[0], np.str_("a"): _f4([3, 4, 5])[0]},
                3: {"next_a": _f4([5, 6, 7])[0], np.str_("a"): _f4([4, 5, 6])[0]},
                4: {"next_a": _f4([6, 7, 8])[0], np.str_("a"): _f4([5, 6, 7])[0]},
            },
        },
        {
            "a": _f4([1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 7]),
            "next_a": _f4([2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 7], [6, 7, 8]),
        },
    ),
    "incompatible_unsafe_stack_compress": (
        {
            "data": {"a": _f4([1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6])},
            "safe": False,
            "cache": {2: {np.str_("a"): _f4([3, 4, 5])[0]}, 3: {np.str_("a"): _f4([4, 5, 6])[0]}},
        },
        {"a": _f4([1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6])},
    ),
}


def test_numpy1_pickles_name_the_globals_of_cpprb_v1_files():
    members = _members(**V1_CASES["unsafe_next_of_stack_compress"][0], numpy1=True)
    assert _globals(members["data"]) == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    assert _globals(members["cache"]) == {
        "numpy.core.multiarray _reconstruct",
        "numpy ndarray",
        "numpy dtype",
        "numpy.core.multiarray scalar",
    }


@pytest.mark.parametrize("numpy1", [True, False], ids=["numpy1", "numpy2"])
@pytest.mark.parametrize("case", list(V1_CASES))
def test_reads_the_cases_of_cpprb_v1_files(case, numpy1):
    members, expected = V1_CASES[case]
    _assert_same(read_cpprb_transitions(_file(**members, numpy1=numpy1)), expected)


def test_an_unsafe_file_takes_the_cached_rows_over_the_stored_ones():
    # Slot 1 ends an episode: its next and its stacked row come from the cache, not from slot 2.
    data = {"a": _f4([1, 2], [2, 3], [7, 7], [8, 9])}
    cache = {1: {"next_a": _f4([3, 4])[0], "a": _f4([2, 5])[0]}, 3: {"next_a": _f4([9, 9])[0], "a": _f4([8, 9])[0]}}
    got = read_cpprb_transitions(_file(data, safe=False, next_of=["a"], cache=cache))
    _assert_same(got, {"a": _f4([1, 2], [2, 5], [7, 7], [8, 9]), "next_a": _f4([2, 3], [3, 4], [8, 9], [9, 9])})


def test_big_endian_arrays_come_back_in_native_byte_order():
    data = {"a": np.arange(6, dtype=">f8").reshape(3, 2), "b": np.arange(3, dtype=">i4")[:, None]}
    got = read_cpprb_transitions(_file(data))
    _assert_same(got, {"a": np.arange(6, dtype="=f8").reshape(3, 2), "b": np.arange(3, dtype="=i4")[:, None]})


def test_fortran_ordered_arrays_keep_their_values():
    values = np.arange(12, dtype=np.int16).reshape(4, 3)
    got = read_cpprb_transitions(_file({"a": np.asfortranarray(values)}))
    _assert_same(got, {"a": values})
    assert got["a"].flags.c_contiguous and got["a"].flags.writeable


def test_reads_a_path_a_path_string_and_a_file_object(tmp_path):
    path = tmp_path / "rb.npz"
    path.write_bytes(_file({"a": _f4(1, 2)}).getvalue())
    with open(path, "rb") as f:
        read = [read_cpprb_transitions(path), read_cpprb_transitions(str(path)), read_cpprb_transitions(f)]
    for got in read:
        _assert_same(got, {"a": _f4(1, 2)})


def test_read_cpprb_file_reports_the_layout_and_the_nstep_flag():
    unsafe = read_cpprb_file(_file(**V1_CASES["unsafe_next_of"][0]))
    nstep = read_cpprb_file(_file(**V1_CASES["Nstep"][0]))
    assert (unsafe.safe, unsafe.nstep, nstep.safe, nstep.nstep) == (False, False, True, True)


# -- files that would run code ------------------------------------------------------------------


class _Opens:
    """Unpickles as ``open(marker, "w")``: creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return open, (str(self.marker), "w")


class _Runs:
    """Unpickles as ``os.system("touch marker")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _opcodes(*lines: str) -> bytes:
    """A protocol-0 pickle written opcode by opcode."""
    return "\n".join(lines).encode() + b"\n"


def _attacks(marker: Path) -> dict[str, tuple[str, bytes]]:
    """Each attack: the member it replaces and that member's bytes.  Unpickled, each creates ``marker``."""
    code = f"open({str(marker)!r}, 'w')"
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    return {
        "the data member itself": ("data", _object_npy(_Opens(marker))),
        "a value of the data dict": ("data", _object_npy({"a": _Opens(marker)})),
        "an element of a numpy object array in the dict": ("data", _object_npy({"a": np.array([_Runs(marker)])})),
        "a row of the cache": ("cache", _object_npy({0: {"next_a": _Runs(marker)}})),
        "the next_of member": ("next_of", _object_npy(_Runs(marker))),
        "a GLOBAL of builtins.eval": ("data", _object_header() + _opcodes("cbuiltins", "eval", f"(V{code}", "tR.")),
        "a GLOBAL of a numpy function that runs code": (
            "data",
            _object_header() + _opcodes("cnumpy.testing._private.utils", "runstring", f"(V{code}", "(dtR."),
        ),
        "an admitted numpy global called on eval": (
            "data",
            _object_header()
            + _opcodes(
                f"c{reconstruct.__module__}",
                reconstruct.__name__,
                "(cbuiltins",
                "eval",
                f"(V{code}",
                "tR(I0",
                "tVb",
                "tR.",
            ),
        ),
    }


ATTACKS = list(_attacks(Path("marker")))


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_attack_files_run_code_when_unpickled(tmp_path, attack):
    # The attacks are live, so the refusals below mean something: plain pickle runs each one.
    marker = tmp_path / "marker"
    _, npy = _attacks(marker)[attack]
    with contextlib.suppress(Exception):  # what the attack builds may fail afterwards: it has run by then
        pickle.loads(_pickle_of(npy))
    assert marker.exists()


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path, attack):
    marker = tmp_path / "marker"
    member, npy = _attacks(marker)[attack]
    with pytest.raises(ValueError, match=rf"member '{member}' holds a reference to .*refused without running it"):
        read_cpprb_transitions(_with(member, npy))
    assert not marker.exists()


def test_a_refusal_names_the_file_and_the_global_found(tmp_path):
    path = tmp_path / "evil.npz"
    path.write_bytes(_with("data", _attacks(tmp_path / "marker")["a GLOBAL of builtins.eval"][1]).getvalue())
    with pytest.raises(
        TransitionFileError,
        match=r"cpprb file '.*evil\.npz': member 'data' holds a reference "
        r"to builtins\.eval",
    ):
        read_cpprb_transitions(path)


def test_a_state_set_on_an_admitted_global_is_refused():
    # BUILD on what find_class returned would otherwise change the loader's own objects.
    with pytest.raises(ValueError, match=r"holds a state set on numpy\.dtype"):
        read_cpprb_transitions(_with("data", _object_header() + _opcodes("cnumpy", "dtype", "}b.")))


class _Reduces:
    """Pickles as the given reduce tuple: numpy's own reconstruction with other arguments."""

    def __init__(self, *reduce: Any) -> None:
        self.reduce = reduce

    def __reduce__(self) -> Any:
        return self.reduce


_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]
HOSTILE_NUMPY = {
    "an array claiming more items than its bytes": _Reduces(
        _RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (10**12,), np.dtype("f4"), False, b"\0" * 4)
    ),
    "another shape for _reconstruct": _Reduces(_RECONSTRUCT, (np.ndarray, (10**9,), b"b")),
    "another type for _reconstruct": _Reduces(_RECONSTRUCT, (np.ma.MaskedArray, (0,), b"b")),
    "a structured dtype": np.zeros(2, dtype=[("x", "f4"), ("y", "i8")]),
    "a datetime dtype": np.zeros(2, dtype="M8[s]"),
    "a string array": np.array(["a", "b"]),
    "a dtype state with other entries": _Reduces(np.dtype, ("f4", False, True), {"x": 1}),
    "an object array of several items": np.array([1, 2], dtype=object),
    "a scalar of dtype object": _Reduces(np.float64(0).__reduce__()[0], (np.dtype(object), 1)),
}


@pytest.mark.parametrize("case", list(HOSTILE_NUMPY))
def test_numpy_reconstruction_with_arguments_cpprb_never_writes_is_refused(case):
    with pytest.raises(ValueError, match=r"member 'data' holds"):
        read_cpprb_transitions(_with("data", _object_npy({"a": HOSTILE_NUMPY[case]})))


# -- malformed files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [b"", b"not a zip archive", b"PK\x03\x04" + b"\0" * 40], ids=["empty", "text", "zip magic"]
)
def test_bytes_that_are_no_npz_archive_raise_value_error(raw):
    with pytest.raises(ValueError, match=r"not a readable \.npz archive"):
        read_cpprb_transitions(io.BytesIO(raw))


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED], ids=["deflated", "stored"])
def test_a_truncated_file_raises_value_error_wherever_it_is_cut(compression):
    raw = _archive(_members(**V1_CASES["unsafe_next_of_stack_compress"][0]), compression=compression)
    for end in range(0, len(raw), 7):
        with pytest.raises(ValueError):
            read_cpprb_transitions(io.BytesIO(raw[:end]))


DAMAGE_SOURCES = {
    numpy1: _members(**V1_CASES["unsafe_next_of_stack_compress"][0], numpy1=numpy1) for numpy1 in (False, True)
}


@settings(max_examples=300, deadline=None)
@given(numpy1=st.booleans(), member=st.sampled_from(list(DAMAGE_SOURCES[False])), data=st.data())
def test_damaged_member_bytes_raise_value_error_or_read_as_some_file(numpy1, member, data):
    # The archive is rebuilt around the damaged member, so its checksum does not catch the damage.
    members = dict(DAMAGE_SOURCES[numpy1])
    raw = bytearray(members[member])
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(raw)))
        change = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if change == "cut":
            del raw[position:]
        elif change == "insert":
            raw[position:position] = data.draw(st.binary(min_size=1, max_size=9))
        elif position < len(raw):
            raw[position] = data.draw(st.integers(0, 255))
    members[member] = bytes(raw)
    try:
        got = read_cpprb_transitions(io.BytesIO(_archive(members)))
    except ValueError:
        return
    assert all(isinstance(array, np.ndarray) and array.flags.writeable for array in got.values())


def _pickled(body: bytes) -> bytes:
    """An object member whose pickle is ``body`` (protocol 4 header, then ``body``)."""
    return _object_header() + b"\x80\x04" + body


FOREIGN_OPCODES = {
    "INST": b"i" + b"posix\nsystem\n",
    "NEWOBJ": b"N)\x81",
    "EXT1": b"\x82\x01",
    "PERSID": b"Pid\n",
    "BYTEARRAY8": b"\x96" + (3).to_bytes(8, "little") + b"abc",
    "UNICODE": b"V" + b"text\n",
}


@pytest.mark.parametrize("opcode", list(FOREIGN_OPCODES))
def test_a_pickle_opcode_numpy_never_writes_for_these_arrays_is_refused(opcode):
    with pytest.raises(ValueError, match=f"member 'data' holds the pickle opcode {opcode}, which cpprb never writes"):
        read_cpprb_transitions(_with("data", _pickled(FOREIGN_OPCODES[opcode])))


def test_a_pickled_length_beyond_the_member_is_refused_before_allocating():
    # The unpickler would allocate the 2**60 bytes this BINBYTES8 claims before reading them.
    with pytest.raises(ValueError, match=r"member 'data' is not a readable pickle .*bytes8"):
        read_cpprb_transitions(_with("data", _pickled(b"\x8e" + (2**60).to_bytes(8, "little") + b"abc.")))


def test_a_memo_index_beyond_the_memo_is_refused_before_allocating():
    # The unpickler would grow its memo to 2**31 entries for this LONG_BINPUT.
    with pytest.raises(ValueError, match="memo index 2147483648 after 0 entries"):
        read_cpprb_transitions(_with("data", _pickled(b"Nr" + (2**31).to_bytes(4, "little") + b".")))


@pytest.mark.parametrize(("descr", "shape"), [("|b1", (10**12,)), ("<U0", (10**15,))], ids=["bool", "zero-size"])
def test_a_plain_member_whose_header_claims_other_data_is_refused_before_allocating(descr, shape):
    with pytest.raises(ValueError, match=r"member 'next_of' holds 1 bytes of data; its header says"):
        read_cpprb_transitions(_with("next_of", damage.npy_header(descr, shape) + b"\0"))


def test_next_of_names_beyond_unicode_are_refused():
    names = np.frombuffer((0x110000).to_bytes(4, "little"), dtype="<U1")
    with pytest.raises(ValueError, match="member 'next_of' is shape \\(1,\\) <U1; expected distinct field names"):
        read_cpprb_transitions(_with("next_of", damage.npy_bytes(names)))


@pytest.mark.parametrize(
    ("old", "new"),
    [(b"), }", b" , }"), (b"'fortran_order'", b"b'fortran_orde'")],
    ids=["unclosed bracket", "bytes key"],
)
def test_an_npy_header_numpy_cannot_parse_is_refused(old, new):
    # numpy's header parser raises TokenError and TypeError (no ValueError) on these.
    members = _members({"a": _f4(1)})
    header_end = members["version"].index(b"\n")
    assert members["version"][:header_end].count(old) == 1
    members["version"] = members["version"][:header_end].replace(old, new) + members["version"][header_end:]
    with pytest.raises(ValueError, match="member 'version' is damaged or truncated"):
        read_cpprb_transitions(io.BytesIO(_archive(members)))


def test_an_npz_that_cpprb_did_not_write_is_refused():
    stream = io.BytesIO()
    np.savez(stream, obs=np.zeros(3))
    with pytest.raises(ValueError, match="not a file of cpprb's save_transitions"):
        read_cpprb_transitions(io.BytesIO(stream.getvalue()))


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_missing_or_extra_member_is_refused(change):
    members = _members({"a": _f4(1)})
    if change == "missing":
        del members["cache"]
    else:
        members["evil"] = damage.npy_bytes(1)
    with pytest.raises(ValueError, match="its members are"):
        read_cpprb_transitions(io.BytesIO(_archive(members)))


def test_an_unknown_format_version_is_refused_and_named():
    with pytest.raises(ValueError, match="unknown cpprb format version 2"):
        read_cpprb_transitions(_file({"a": _f4(1)}, version=2))


@pytest.mark.parametrize(
    ("member", "value", "message"),
    [
        ("safe", damage.npy_bytes(np.int64(1)), "member 'safe' is shape \\(\\) int64; expected a bool"),
        ("Nstep", damage.npy_bytes(np.zeros(2, bool)), "member 'Nstep' is shape \\(2,\\) bool; expected a bool"),
        ("version", damage.npy_bytes(1.0), "member 'version' is shape \\(\\) float64; expected an integer"),
        ("safe", _object_npy(True), "member 'safe' is a pickle"),
        ("data", damage.npy_bytes(np.zeros(3)), "member 'data' is a plain array"),
        (
            "next_of",
            damage.npy_bytes(np.zeros(3)),
            "member 'next_of' is shape \\(3,\\) float64; expected distinct field names",
        ),
        ("next_of", _object_npy("a"), "member 'next_of' holds 'a'; expected None"),
    ],
    ids=[
        "safe int",
        "Nstep array",
        "version float",
        "safe pickled",
        "data plain",
        "next_of numbers",
        "next_of pickled str",
    ],
)
def test_a_member_of_the_wrong_kind_is_refused_and_named(member, value, message):
    with pytest.raises(ValueError, match=message):
        read_cpprb_transitions(_with(member, value))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([_f4(1)], "holds a list; expected a non-empty dict"),
        ({}, "holds a dict; expected a non-empty dict"),
        ({"a": [1.0, 2.0]}, r"data\['a'\] is a list; expected a numeric array"),
        ({"a": "text"}, r"data\['a'\] is 'text'; expected a numeric array"),
        ({"a": np.float32(1)}, r"data\['a'\] is 1.0; expected a numeric array"),
        ({"a": np.array(1.0)}, r"data\['a'\] is a 0-d array"),
        ({"a": _f4(1, 2), "b": _f4(1)}, "differ in length"),
        ({"a": np.array(["x", "y"])}, "an array of dtype <U1"),
        ({1: _f4(1)}, "has the key 1; expected field names"),
        ({"a": np.array([None], dtype=object)}, "an object array of shape \\(1,\\)"),
        (None, "holds None"),
    ],
)
def test_data_that_is_not_a_dict_of_equally_long_numeric_arrays_is_refused(data, message):
    with pytest.raises(ValueError, match=message):
        read_cpprb_transitions(_file(data))


def test_one_array_under_two_names_is_refused():
    shared = _f4(1, 2)
    with pytest.raises(ValueError, match="one array under two names"):
        read_cpprb_transitions(_file({"a": shared, "b": shared}))


def test_a_safe_file_with_a_cache_is_refused():
    with pytest.raises(ValueError, match="the safe layout holds no cache"):
        read_cpprb_transitions(_file({"a": _f4(1)}, cache={0: {"a": _f4(1)[0]}}))


UNSAFE = {"data": {"a": _f4([1, 2], [3, 4])}, "safe": False, "next_of": ["a"]}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cache": None}, "member 'cache' holds None; the unsafe layout holds a dict"),
        ({"cache": {2: {"next_a": _f4([0, 0])[0]}}}, r"the slot 2; expected slots in \[0, 2\)"),
        ({"cache": {-1: {"next_a": _f4([0, 0])[0]}}}, r"the slot -1"),
        ({"cache": {"1": {"next_a": _f4([0, 0])[0]}}}, r"the slot '1'"),
        (
            {"cache": {1: {"next_a": _f4([0, 0, 0])[0]}}},
            (
                r"cache\[1\]\['next_a'\] is shape \(3,\) float32; "
                r"expected one row of 'a': shape \(2,\) float32"
            ),
        ),
        ({"cache": {1: {"next_a": np.zeros(2)}}}, r"cache\[1\]\['next_a'\] is shape \(2,\) float64"),
        ({"cache": {1: {"next_b": _f4([0, 0])[0], "next_a": _f4([0, 0])[0]}}}, "the key 'next_b', which is no field"),
        ({"cache": {1: {"a": _f4([0, 0])[0]}}}, r"cache\[1\] holds a dict; expected the same keys .* \['next_a'\]"),
        (
            {"cache": {0: {"next_a": _f4([0, 0])[0]}, 1: {"next_a": _f4([0, 0])[0], "a": _f4([0, 0])[0]}}},
            "expected the same keys as every entry",
        ),
        ({"cache": {1: [_f4([0, 0])[0]]}}, r"cache\[1\] holds a list"),
        ({"cache": {}, "next_of": ["b"]}, "next_of names 'b', which is not a field"),
        ({"cache": {}, "next_of": ["a", "a"]}, "expected distinct field names"),
    ],
)
def test_an_unsafe_file_whose_cache_does_not_fit_its_data_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        read_cpprb_transitions(_file(**{**UNSAFE, **changes}))


def test_an_object_member_of_another_shape_is_refused():
    stream = io.BytesIO()
    np.lib.format.write_array(stream, np.array([{"a": _f4(1)}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"member 'data' is an object array of shape \(2,\)"):
        read_cpprb_transitions(_with("data", stream.getvalue()))


def test_bytes_after_a_pickle_are_refused():
    with pytest.raises(ValueError, match="member 'data' has bytes after its pickle"):
        read_cpprb_transitions(_with("data", _object_npy({"a": _f4(1)}) + b"\0"))


def test_a_text_mode_file_is_a_type_error(tmp_path):
    path = tmp_path / "rb.npz"
    path.write_bytes(_file({"a": _f4(1)}).getvalue())
    with open(path) as f, pytest.raises(TypeError, match="text-mode"):
        read_cpprb_transitions(f)
