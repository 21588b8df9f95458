"""``mpreplay demo --checkpoint-every SECONDS`` and ``--resume DIR``: a run's checkpoints, and a
run that goes on from one.

A checkpoint is a folder ``DIR/checkpoints/NNNNNN`` (numbered on across resumes) of:

* ``replay/``: the replay table's checkpoint (:meth:`mpreplay.Table.checkpoint`);
* ``learner.npz``: the learner's networks, optimizer state and counters
  (:func:`~mpreplay.demo.processes.learner_state`), plain arrays read back with
  ``allow_pickle=False``;
* ``curve.npz``: every episode of the learning curve so far (:class:`~mpreplay.demo.report.Episodes`);
* ``state.json``: the agent, the task and every flag of the run, the counters (env steps,
  episodes, running time, weights published, learner steps), the marks of earlier resumes and
  the ε ladder.

Nothing in it is code: a resumed run reads JSON and raw arrays, never a pickle.  The parent
writes it, on a thread of its own, from what the processes share: the learner publishes its whole
state through a :class:`~mpreplay.params.ParameterStore` with its weights, the parent's monitor
holds the curve and counters, and the parent's handle checkpoints the replay while actors write
and the learner samples.  The folder is written as ``.NNNNNN.tmp-<pid>``, every file and the
folder synced, then renamed into place; only then are older checkpoints removed.  A process killed
at any point -- SIGKILL included -- leaves the previous checkpoint whole, and the latest whole one
is the highest number.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import IO, Any

import numpy as np

from .._version import __version__
from ..errors import CheckpointError
from ..monitor import list_segments, remove_segments
from ..params import ParameterStore
from ..restore import restore
from ..writeback import fsync_folder
from .processes import LEARNER_COUNTERS, Agent, import_torch, learner_state, make_optimizer
from .report import Episodes, Monitor, Progress
from .task import Config, epsilon

__all__ = [
    "CHECKPOINTS",
    "Checkpointer",
    "FolderInUse",
    "Saved",
    "hold_folder",
    "learner_template",
    "read_checkpoint",
    "read_state",
    "record_segments",
    "restored_replay",
    "sweep_segments",
]

CHECKPOINTS = "checkpoints"  # the folder of a run's checkpoints, in its output folder
FORMAT = "mpreplay-demo-checkpoint"
VERSION = 1
STATE, LEARNER, CURVE, REPLAY = "state.json", "learner.npz", "curve.npz", "replay"
SEGMENTS = "segments.json"  # the shared-memory segments of the run now under way in a folder
LOCK = "run.lock"  # held by the run that checkpoints into a folder (flock: the kernel lets go at its death)
_CURVE_DTYPES = {"time": np.float64, "env_steps": np.int64, "ret": np.float64, "rank": np.int64, "eps": np.float64}
_LOCK_TIMEOUT = 30.0  # seconds a checkpoint waits for the replay's lock
_STATE_KEYS = {"agent": str, "env": str, "config": dict, "number": int, "counters": dict, "restarts": list}


@dataclass(frozen=True)
class Saved:
    """A checkpoint read back: its ``folder``, ``state.json`` (``state``), the learner's state as
    arrays (``learner``) and where the run stood (``progress``)."""

    folder: str
    state: dict[str, Any]
    learner: dict[str, np.ndarray]
    progress: Progress

    @property
    def online(self) -> dict[str, np.ndarray]:
        """The learner's online network, as the actors' weights store takes it."""
        return {key[len("online.") :]: value for key, value in self.learner.items() if key.startswith("online.")}

    def mark(self, stored: int) -> dict[str, Any]:
        """Where a run resumed from this checkpoint starts: the restart the plot marks."""
        counters = self.state["counters"]
        keep = ("elapsed_seconds", "env_steps", "episodes", "learner_steps", "weights_published", "inserts")
        return {"checkpoint": self.folder, "stored": stored, **{key: counters[key] for key in keep}}


def _numbered(out: str) -> list[int]:
    folder = os.path.join(out, CHECKPOINTS)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def read_state(out: str) -> tuple[str, dict[str, Any]]:
    """The latest checkpoint of the run in folder ``out`` and its ``state.json``, checked;
    :class:`~mpreplay.errors.CheckpointError` naming what is missing or wrong otherwise."""
    numbers = _numbered(out)
    if not numbers:
        where = os.path.join(out, CHECKPOINTS)
        raise CheckpointError(f"no checkpoint in {where} (a run writes them with --checkpoint-every)")
    folder = os.path.join(out, CHECKPOINTS, f"{numbers[-1]:06d}")
    where = os.path.join(folder, STATE)
    try:
        with open(where, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{where}: not a readable demo checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an mpreplay demo checkpoint (format {FORMAT!r} expected)")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{where}: version {state.get('version')!r}; this mpreplay reads {VERSION}")
    wrong = next((key for key, kind in _STATE_KEYS.items() if not isinstance(state.get(key), kind)), None)
    if wrong is not None:
        raise CheckpointError(f"{where}: its {wrong!r} is not what a demo checkpoint writes there")
    return folder, state


def _arrays(path: str) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file at ``path``, each read whole (zip checks its CRC-32)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in saved.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path}: damaged or not an array file ({exc})") from None


def read_checkpoint(folder: str, state: dict[str, Any]) -> Saved:
    """The checkpoint in ``folder`` (whose ``state.json`` :func:`read_state` read) with its arrays."""
    learner = _arrays(os.path.join(folder, LEARNER))
    curve = _arrays(os.path.join(folder, CURVE))
    if sorted(curve) != sorted(_CURVE_DTYPES) or len({len(v) for v in curve.values()}) != 1:
        raise CheckpointError(f"{os.path.join(folder, CURVE)}: expected arrays {sorted(_CURVE_DTYPES)} of one length")
    counters = state["counters"]
    try:
        progress = Progress(
            Episodes(**{key: curve[key].tolist() for key in _CURVE_DTYPES}),
            float(counters["elapsed_seconds"]),
            int(counters["env_steps"]),
            int(counters["weights_published"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{os.path.join(folder, STATE)}: its counters lack {exc}") from None
    return Saved(folder, state, learner, progress)


@contextmanager
def restored_replay(saved: Saved) -> Iterator[Any]:
    """The run's replay table made again from the checkpoint's (a new shared segment), closed after."""
    with restore(os.path.join(saved.folder, REPLAY)) as replay:
        yield replay


def learner_template(agent: Agent, config: Config) -> dict[str, Any]:
    """What the learner's state looks like (:func:`~mpreplay.demo.processes.learner_state`), from a
    network and optimizer made for that: the shapes of the store it publishes to."""
    torch = import_torch()
    online = agent.network(config)
    optimizer = make_optimizer(online, config)
    for parameter in online.parameters():  # one step of zero gradients makes the optimizer's state
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    return learner_state(online, online, optimizer, dict.fromkeys(LEARNER_COUNTERS, 0))


def _ladder(config: Config) -> list[float]:
    n = config.actors * config.envs_per_actor
    return [epsilon(i, n) for i in range(n)]


def _write_json(path: str, doc: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


class Checkpointer:
    """Writes the run's checkpoints into ``config.out``: every ``config.checkpoint_every`` seconds
    on a thread (:meth:`every`) and once more at the end (:meth:`write`).

    Checkpoints start once the learner has published its state (a resumed run's store holds
    the state it resumed from).  A checkpoint that fails is reported on stderr and the run goes on.
    """

    def __init__(
        self,
        agent_key: str,
        config: Config,
        replay: Any,
        learner: ParameterStore,
        monitor: Monitor,
        extra: Mapping[str, Any],
        saved: Saved | None,
    ):
        self._agent, self._config, self._replay = agent_key, config, replay
        self._learner, self._monitor = learner, monitor
        self._extra = dict(extra)  # the restart marks and the random policy's baseline, carried on
        self._folder = os.path.join(config.out, CHECKPOINTS)
        numbers = _numbered(config.out)
        self._number = numbers[-1] + 1 if numbers else 1
        self.written: list[str] = []
        self.failed = 0
        self._saved = saved
        os.makedirs(self._folder, exist_ok=True)
        for entry in os.listdir(self._folder):  # what checkpoints killed midway left
            if entry.startswith("."):
                shutil.rmtree(os.path.join(self._folder, entry), ignore_errors=True)

    def every(self, done: threading.Event) -> None:
        """Write a checkpoint every ``checkpoint_every`` seconds until ``done`` is set."""
        assert self._config.checkpoint_every is not None
        while not done.wait(self._config.checkpoint_every):
            self.write()

    def write(self) -> str | None:
        """Write the next checkpoint; its folder, or None if there is none to write yet or it failed."""
        if self._learner.version == 0 and self._saved is None:
            return None  # the learner has not published its state yet
        number, self._number = self._number, self._number + 1
        final = os.path.join(self._folder, f"{number:06d}")
        tmp = os.path.join(self._folder, f".{number:06d}.tmp-{os.getpid()}")
        try:
            os.makedirs(tmp)
            self._write_folder(tmp, number)
            fsync_folder(tmp)
            os.rename(tmp, final)
            fsync_folder(self._folder)
        except Exception as exc:  # a full disk, a lock held too long: the run goes on without it
            shutil.rmtree(tmp, ignore_errors=True)
            self.failed += 1
            print(f"checkpoint {number} not written: {exc!r}", file=sys.stderr)
            return None
        for older in _numbered(self._config.out):
            if older < number:
                shutil.rmtree(os.path.join(self._folder, f"{older:06d}"), ignore_errors=True)
        self.written.append(final)
        return final

    def learner_counters(self) -> dict[str, int] | None:
        """The counters of the learner's last published state (None before its first): what a
        learner that did not return in time had done."""
        if self._learner.version == 0 and self._saved is None:
            return None
        return _counters(self._learner.read()[0])

    def _write_folder(self, tmp: str, number: int) -> None:
        state, _ = self._learner.read()
        arrays: dict[str, Any] = {key: np.asarray(value) for key, value in state.items()}
        counters: dict[str, Any] = _counters(arrays)
        snapshot, progress = self._monitor.progress()
        info = self._replay.checkpoint(os.path.join(tmp, REPLAY), timeout=_LOCK_TIMEOUT)
        curve = {key: np.asarray(values, _CURVE_DTYPES[key]) for key, values in asdict(progress.episodes).items()}
        for name, content in ((LEARNER, arrays), (CURVE, curve)):
            with open(os.path.join(tmp, name), "wb") as f:
                np.savez(f, **content)
                f.flush()
                os.fsync(f.fileno())
        counters.update(
            elapsed_seconds=round(progress.elapsed, 3),
            env_steps=progress.env_steps,
            episodes=len(progress.episodes.ret),
            weights_published=progress.weights_published,
            inserts=snapshot["inserts"],
            samples=snapshot["samples"],
            stored=info["stored"],
        )
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "mpreplay": __version__,
            "created": time.time(),
            "agent": self._agent,
            "env": self._config.env,
            "config": asdict(self._config),
            "number": number,
            "counters": counters,
            "epsilons": _ladder(self._config),
            **self._extra,
        }
        _write_json(os.path.join(tmp, STATE), doc)
        print(
            f"checkpoint {number}: learner step {counters['learner_steps']:,}, {info['stored']:,} rows, "
            f"{counters['episodes']:,} episodes",
            flush=True,
        )


def _counters(state: Mapping[str, Any]) -> dict[str, int]:
    return dict(zip(LEARNER_COUNTERS, (int(c) for c in np.asarray(state["counters"])), strict=True))


def record_segments(out: str, names: list[str]) -> None:
    """Note in ``out`` the segments of the run now under way: a run resumed after this one was
    killed removes them (:func:`sweep_segments`)."""
    tmp = os.path.join(out, f".{SEGMENTS}.tmp-{os.getpid()}")
    _write_json(tmp, {"pid": os.getpid(), "segments": names})
    os.replace(tmp, os.path.join(out, SEGMENTS))


def sweep_segments(out: str) -> list[str]:
    """Remove the segments that the run noted in ``out`` left behind, killed (their owner is gone);
    return their names.  A live owner's segments, and a persistent table, are kept."""
    try:
        with open(os.path.join(out, SEGMENTS), encoding="utf-8") as f:
            noted = set(json.load(f)["segments"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    left = [s.name for s in list_segments() if s.name in noted and not (s.owner_alive or s.persistent)]
    return [r.name for r in remove_segments(left) if r.removed] if left else []


class FolderInUse(RuntimeError):
    """Another live run checkpoints into the output folder."""


def hold_folder(out: str) -> IO[str]:
    """Hold ``out`` for this run's checkpoints until the returned file is closed (or the process
    ends, however it ends); FolderInUse, naming the other run's process, while another holds it:
    two runs numbering checkpoints in one folder would replace each other's."""
    lock = open(os.path.join(out, LOCK), "a+", encoding="utf-8")  # noqa: SIM115 - held past this call
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        other = lock.read().strip() or "unknown"
        lock.close()
        raise FolderInUse(f"{out}: another run (process {other}) is writing its checkpoints there") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock
