"""The peers of the benchmarks -- Tianshou, TorchRL, flashbax, numba, Reverb -- each in a worker process of its own.

``python -m mpreplay.bench.peers --setup DIR`` makes two venvs from the versions pinned beside this
file (one place for them): at ``DIR`` the peers of ``peers-requirements.txt`` (TorchRL's wheel loads
only with the torch it was built for, flashbax only with a jax it knows), and at ``DIR/reverb``
Reverb with the TensorFlow and numpy 1.x of ``peers-requirements-reverb.txt`` (on Python 3.11: no
later Python has a dm-reverb wheel).  They live apart from mpreplay's environment, and from each
other.  ``--check DIR`` says what each peer there loads with, or why it does not.

A benchmark given that directory (``--peers DIR``, or the environment variable
``MPREPLAY_PEERS``) runs each contender as ``PYTHON peer_worker.py NAME``: the peers with their
venv's interpreter, mpreplay, cpprb and the floor with this one.  A peer that cannot be started
or loaded is reported as :class:`Unavailable` with the reason, never replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REQUIREMENTS = Path(__file__).with_name("peers-requirements.txt")
REVERB_REQUIREMENTS = Path(__file__).with_name("peers-requirements-reverb.txt")
WORKER = Path(__file__).with_name("peer_worker.py")
ENV_VAR = "MPREPLAY_PEERS"
LOCAL = ("mpreplay", "cpprb", "floor")  # run by this interpreter
PEERS = ("tianshou", "torchrl", "flashbax", "numba")  # run by the peers' venv
REVERB = "reverb"  # run by the Reverb venv, DIR/reverb
REVERB_PYTHON = (3, 11)  # the newest CPython dm-reverb 0.14.0 has wheels for
_MPREPLAY_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding this mpreplay package
SETUP_HINT = f"create it with `python -m mpreplay.bench.peers --setup DIR` and pass --peers DIR (or set {ENV_VAR})"


class PeerError(RuntimeError):
    """A worker answered a command with an error, or died; the message is the reason."""


class Unavailable(NamedTuple):
    """A contender that could not be started or loaded, and why."""

    name: str
    reason: str


def peers_directory(directory: str | None) -> str | None:
    """``directory``, else the environment's ``MPREPLAY_PEERS``, else None."""
    return directory or os.environ.get(ENV_VAR) or None


def venv_of(directory: str, name: str) -> Path:
    """Where ``name``'s venv is: ``directory`` for the peers, ``directory/reverb`` for Reverb."""
    return Path(directory) / REVERB if name == REVERB else Path(directory)


def peers_python(directory: str | None, name: str = PEERS[0]) -> tuple[str | None, str]:
    """The interpreter that runs peer ``name`` in ``directory`` (or ``MPREPLAY_PEERS``), or None and why not."""
    directory = peers_directory(directory)
    if directory is None:
        return None, f"no peers venv given: {SETUP_HINT}"
    python = venv_of(directory, name) / "bin" / "python"
    if not python.exists():
        return None, f"no interpreter at {python}: {SETUP_HINT}"
    return str(python), ""


class PeerProcess:
    """One contender's worker process and its line-per-command protocol."""

    def __init__(self, name: str, python: str):
        self.name = name
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed by close()
        env = dict(os.environ)
        if name not in LOCAL:  # a peers' venv has its own packages: nothing of this checkout's path
            env.pop("PYTHONPATH", None)
        else:  # the mpreplay this process runs, be it a checkout found through the working directory
            env["PYTHONPATH"] = os.pathsep.join([_MPREPLAY_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        self._process = subprocess.Popen(
            [python, str(WORKER), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None  # both are pipes (PIPE above)
        self._stdin, self._stdout = stdin, stdout
        self.hello: dict[str, Any] = {}

    def request(self, cmd: str, **arguments: Any) -> dict[str, Any]:
        """Send one command; its answer, or :class:`PeerError` with the reason."""
        try:
            self._stdin.write(json.dumps({"cmd": cmd, **arguments}) + "\n")
            self._stdin.flush()
            line = self._stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            status: int | str
            try:  # its output closed: it is exiting, and its status says how
                status = self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                status = "still running, its output closed"
            raise PeerError(f"{self.name}'s worker exited ({status}): {self.stderr_tail()}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise PeerError(answer["error"])
        return answer

    def stderr_tail(self, lines: int = 3) -> str:
        self._stderr.seek(0)
        text = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        return " | ".join(text[-lines:]) or "nothing on stderr"

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._stdin.write('{"cmd": "quit"}\n')
                self._stdin.flush()
                self._process.wait(timeout=30)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for stream in (self._stdin, self._stdout, self._stderr):
            with contextlib.suppress(OSError):  # a "quit" still buffered for a worker that is gone
                stream.close()


def start(name: str, python: str | None, why_not: str = "") -> PeerProcess | Unavailable:
    """A started worker for ``name`` that has loaded its library, or why there is none."""
    if python is None:
        return Unavailable(name, why_not)
    try:
        process = PeerProcess(name, python)
    except OSError as exc:
        return Unavailable(name, f"cannot run {python}: {exc}")
    try:
        process.hello = process.request("hello")
    except PeerError as exc:
        process.close()
        return Unavailable(name, f"does not load: {exc}")
    return process


def launch(names: Iterable[str], directory: str | None) -> dict[str, PeerProcess | Unavailable]:
    """Workers for ``names``: LOCAL ones with this interpreter, the others with their venv's."""
    workers: dict[str, PeerProcess | Unavailable] = {}
    for name in names:
        python, why_not = (sys.executable, "") if name in LOCAL else peers_python(directory, name)
        workers[name] = start(name, python, why_not)
    return workers


def close_all(workers: Iterable[PeerProcess | Unavailable]) -> None:
    for worker in workers:
        if isinstance(worker, PeerProcess):
            worker.close()


def describe(worker: PeerProcess | Unavailable) -> str:
    """``tianshou 2.0.1 (numpy 2.4.6, ...)`` or ``tianshou: unavailable: <reason>``."""
    if isinstance(worker, Unavailable):
        return f"{worker.name}: unavailable: {worker.reason}"
    versions = dict(worker.hello["versions"])
    main = versions.pop(worker.name, None)
    extra = [f"{k} {v}" for k, v in versions.items()]
    if worker.hello.get("torch_threads"):
        extra.append(f"{worker.hello['torch_threads']} torch threads")
    head = worker.name if main is None else f"{worker.name} {main}"
    return f"{head} ({', '.join(extra)}; Python {worker.hello['python']})"


# -- making the venvs ----------------------------------------------------------------------------
def python_for_reverb() -> tuple[str | None, str]:
    """A CPython 3.11 to make Reverb's venv with: this one, else ``python3.11`` on PATH; or why none."""
    if sys.version_info[:2] == REVERB_PYTHON:
        return sys.executable, ""
    found = shutil.which("python{}.{}".format(*REVERB_PYTHON))
    if found:
        return found, ""
    return None, (
        f"dm-reverb 0.14.0 has wheels for CPython 3.8-3.11 only, and neither this interpreter "
        f"({sys.version.split()[0]}) nor python3.11 on PATH is one: give --reverb-python PATH"
    )


def _make_venv(python: str, directory: Path, requirements: Path) -> int:
    steps = [
        [python, "-m", "venv", str(directory)],
        [str(directory / "bin" / "python"), "-m", "pip", "install", "--upgrade", "pip"],
        [str(directory / "bin" / "python"), "-m", "pip", "install", "-r", str(requirements)],
    ]
    for step in steps:
        print("+", " ".join(step), flush=True)
        status = subprocess.call(step)
        if status != 0:
            print(f"mpreplay.bench.peers: `{' '.join(step)}` failed with status {status}", file=sys.stderr)
            return status
    return 0


def setup(
    directory: str,
    python: str = sys.executable,
    reverb_python: str | None = None,
    venvs: Sequence[str] = ("peers", REVERB),
) -> int:
    """Make the peers' venv at ``directory`` and Reverb's at ``directory/reverb``; check what loads."""
    if "peers" in venvs:
        status = _make_venv(python, Path(directory), REQUIREMENTS)
        if status:
            return status
    if REVERB in venvs:
        why_not = ""
        if reverb_python is None:
            reverb_python, why_not = python_for_reverb()
        if reverb_python is None:
            print(f"mpreplay.bench.peers: no Reverb venv: {why_not}", file=sys.stderr)
            return 1
        status = _make_venv(reverb_python, venv_of(directory, REVERB), REVERB_REQUIREMENTS)
        if status:
            return status
    return check(directory)


def check(directory: str | None) -> int:
    """Print what each peer in ``directory`` loads with, or why it does not; 1 if any does not."""
    workers = launch((*PEERS, REVERB), directory)
    try:
        for worker in workers.values():
            print(describe(worker))
    finally:
        close_all(workers.values())
    return int(any(isinstance(w, Unavailable) for w in workers.values()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpreplay.bench.peers", description=__doc__.split("\n\n")[1])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--setup", metavar="DIR", help="make the peers' venvs at DIR and DIR/reverb (about 6 GB and 1.3 GB)"
    )
    group.add_argument("--check", metavar="DIR", help="say what each peer in DIR loads with")
    parser.add_argument(
        "--venvs",
        nargs="+",
        choices=("peers", REVERB),
        default=("peers", REVERB),
        help="with --setup: which venvs to make (default both: peers at DIR, reverb at DIR/reverb)",
    )
    parser.add_argument(
        "--reverb-python", metavar="PATH", help="the CPython 3.11 that makes DIR/reverb (default: found)"
    )
    args = parser.parse_args(argv)
    if args.setup:
        return setup(args.setup, reverb_python=args.reverb_python, venvs=args.venvs)
    return check(args.check)


if __name__ == "__main__":
    sys.exit(main())
