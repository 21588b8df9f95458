"""The side of a benchmark that runs beside one replay library, in that library's interpreter.

``PYTHON peer_worker.py NAME`` serves one contender -- ``mpreplay``, ``cpprb``, ``floor`` (run by
mpreplay's interpreter) or ``tianshou``, ``torchrl``, ``flashbax`` (run by the peers' venv that
``python -m mpreplay.bench.peers --setup DIR`` makes) -- so every library is timed in a process of
its own, with the versions it was installed with.  This file imports only the standard library
and numpy (and, once asked, the library it drives): the peers' venv has no mpreplay.

Protocol: the parent writes one JSON object per line to stdin, ``{"cmd": NAME, ...arguments}``;
the worker answers each with one line on stdout, ``{"ok": true, ...results}`` or
``{"ok": false, "error": "Type: message"}``.  Anything a library prints goes to stderr, so it
cannot garble an answer.  Commands: ``hello`` (import the library; answers its versions),
``per_build``/``per_run`` (:mod:`mpreplay.bench.per`'s loop), ``tput_build``/``tput_run`` and
``seq_build``/``seq_run`` (:mod:`mpreplay.bench.peer_frames`), ``mp_open``/``mp_case``/``mp_close``,
``queue_case`` and ``sharded_case`` (:mod:`mpreplay.bench.peer_mp`: ``bench mp``, ``bench queue``
and ``bench sharded``, Reverb and TorchRL), ``actor_build``/``actor_run``/``actor_close``
(:mod:`mpreplay.bench.peer_actor`: ``bench apex``'s actor loop), ``quit``.

The loop of ``mpreplay bench per`` (:mod:`mpreplay.bench.per_loop`) is the one the in-process
table times too; each library behind its three calls is here (``CONTENDERS``).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

if __package__:  # imported as mpreplay.bench.peer_worker
    from . import numba_tree, peer_actor, peer_frames, peer_mp, per_loop
else:  # a script, run by an interpreter that may not have mpreplay
    # Its folder leaves the path: the benchmarks' modules there (ray.py, memory.py, ...) would
    # shadow the packages a library looks for.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

    def _load(name: str) -> Any:
        # Registered under its own name: its neighbours import it so, and a process spawned from
        # this script, which runs it again first, finds there what a pickled function names.
        spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, f"{name}.py"))
        assert spec is not None and spec.loader is not None  # a .py file beside this one
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    peer_frames = _load("peer_frames")
    numba_tree = _load("numba_tree")
    for _neighbour in ("case_clock", "mp_workloads", "reverb_roles", "torchrl_roles"):
        _load(_neighbour)
    peer_mp = _load("peer_mp")
    per_loop = _load("per_loop")
    peer_actor = _load("peer_actor")

# The loop's settings and calls (:mod:`mpreplay.bench.per_loop`) that the contenders are built for.
ALPHA, BATCH, BETA, EPS, PREFILL_CHUNK = (
    per_loop.ALPHA,
    per_loop.BATCH,
    per_loop.BETA,
    per_loop.EPS,
    per_loop.PREFILL_CHUNK,
)
Floor, as_cpprb, env_dict, workload = per_loop.Floor, per_loop.as_cpprb, per_loop.env_dict, per_loop.workload
drive, timed_drive = per_loop.drive, per_loop.timed_drive


# -- each library behind the loop's three calls ---------------------------------------------
class Contender(NamedTuple):
    """How the worker makes, feeds and fills one library's buffer for the loop."""

    make: Callable[[int, int], Any]  # (capacity, seed) -> add(**item) / sample(n) / update_priorities
    convert: Callable[[dict[str, np.ndarray]], dict[str, Any]]  # transition -> the item add takes
    fill: Callable[[Any, dict[str, np.ndarray], np.ndarray], None]  # (buffer, columns, priorities), untimed


def _chunks(
    columns: dict[str, np.ndarray], priorities: np.ndarray
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    for i in range(0, len(priorities), PREFILL_CHUNK):
        yield {k: v[i : i + PREFILL_CHUNK] for k, v in columns.items()}, priorities[i : i + PREFILL_CHUNK]


def _make_mpreplay(capacity: int, seed: int) -> Any:
    import mpreplay

    return mpreplay.PrioritizedReplayBuffer(capacity, env_dict(None), alpha=ALPHA, eps=EPS, seed=seed)


def _fill_by_add(rb: Any, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
    for rows, p in _chunks(columns, priorities):
        rb.add(**rows, priorities=p)


def _make_cpprb(capacity: int, seed: int) -> Any:
    import cpprb

    # cpprb's sampler seeds itself from std::random_device: `seed` cannot reach it.
    return cpprb.PrioritizedReplayBuffer(capacity, env_dict((1,)), alpha=ALPHA, eps=EPS)


def _fill_cpprb(rb: Any, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
    _fill_by_add(rb, {k: v.reshape(len(v), -1) for k, v in columns.items()}, priorities)


class _Tianshou:
    """``tianshou.data.PrioritizedReplayBuffer``; items are Tianshou ``Batch``es."""

    def __init__(self, capacity: int, seed: int):
        from tianshou.data import PrioritizedReplayBuffer

        np.random.seed(seed)  # noqa: NPY002 -- Tianshou draws from numpy's global generator
        self.rb = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA)

    @staticmethod
    def convert(t: dict[str, np.ndarray]) -> dict[str, Any]:
        from tianshou.data import Batch

        return {
            "batch": Batch(
                obs=t["obs"],
                act=t["act"],
                rew=t["rew"],
                obs_next=t["next_obs"],
                terminated=bool(t["done"]),
                truncated=False,
            )
        }

    def add(self, batch: Any) -> None:
        self.rb.add(batch)

    def sample(self, n: int) -> dict[str, Any]:
        batch, indexes = self.rb.sample(n)
        return {"indexes": indexes, "weights": batch.weight, "batch": batch}

    def update_priorities(self, indexes: np.ndarray, priorities: np.ndarray) -> None:
        self.rb.update_weight(indexes, priorities)

    def fill(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        from tianshou.data import Batch

        # What Tianshou's own ReplayBuffer.from_data does: hand the buffer whole arrays, set its size.
        done = columns["done"] > 0
        self.rb.set_batch(
            Batch(
                obs=columns["obs"],
                act=columns["act"],
                rew=columns["rew"].astype(float),
                obs_next=columns["next_obs"],
                terminated=done,
                truncated=np.zeros_like(done),
                done=done,
            )
        )
        self.rb._size = len(priorities)
        self.rb.update_weight(np.arange(len(priorities)), priorities)


class _TorchRL:
    """``torchrl.data.PrioritizedReplayBuffer`` over a ``LazyTensorStorage``; items are TensorDicts."""

    def __init__(self, capacity: int, seed: int):
        import torch
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        torch.manual_seed(seed)
        self.rb = PrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, eps=EPS, storage=LazyTensorStorage(capacity), batch_size=BATCH
        )
        self._torch = torch

    @staticmethod
    def convert(t: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch
        from tensordict import TensorDict

        return {"item": TensorDict({k: torch.from_numpy(np.array(v)) for k, v in t.items()}, [])}

    def add(self, item: Any) -> None:
        self.rb.add(item)

    def sample(self, n: int) -> dict[str, Any]:
        batch, info = self.rb.sample(n, return_info=True)
        return {"indexes": info["index"], "weights": np.asarray(info["priority_weight"]), "batch": batch}

    def update_priorities(self, indexes: Any, priorities: np.ndarray) -> None:
        self.rb.update_priority(indexes, self._torch.as_tensor(priorities, dtype=self._torch.float32))

    def fill(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        from tensordict import TensorDict

        for rows, p in _chunks(columns, priorities):
            index = self.rb.extend(TensorDict({k: self._torch.from_numpy(v) for k, v in rows.items()}, [len(p)]))
            self.rb.update_priority(index, self._torch.as_tensor(p, dtype=self._torch.float32))


class _Flashbax:
    """flashbax's prioritised trajectory buffer with sequences of one step: a transition buffer.

    Jitted, each on its own: ``add`` and ``set_priorities`` (the state donated, so its arrays are
    updated in place rather than copied), and a ``sample`` that also splits the key and turns
    probabilities into importance weights.  The state stays a Python variable between the
    calls, as in a loop whose environment is not JAX; items come from numpy."""

    def __init__(self, capacity: int, seed: int):
        import flashbax
        import jax
        import jax.numpy as jnp

        with warnings.catch_warnings():  # it says max_size sets the time axis to max_size: as meant
            warnings.simplefilter("ignore")
            buffer = flashbax.make_prioritised_trajectory_buffer(
                add_batch_size=1,
                sample_batch_size=BATCH,
                sample_sequence_length=1,
                period=1,
                min_length_time_axis=1,
                max_size=capacity,
                priority_exponent=ALPHA,
                device="cpu",
            )
        example = {k: jnp.zeros(v.shape[2:], v.dtype) for k, v in self.convert(workload(0)[0][0])["item"].items()}
        self.state = buffer.init(example)
        self.key = jax.random.PRNGKey(seed)
        self._add = jax.jit(buffer.add, donate_argnums=0)
        self._set = jax.jit(buffer.set_priorities, donate_argnums=0)

        def sample(state: Any, key: Any) -> Any:
            key, draw = jax.random.split(key)
            batch = buffer.sample(state, draw)
            stored = jnp.where(state.is_full, capacity, state.current_index)
            weights = (stored * batch.probabilities) ** -BETA
            return key, batch.experience, batch.indices, weights / weights.max()

        self._sample = jax.jit(sample)

    @staticmethod
    def _host(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # JAX computes in 32 bits unless told otherwise: act is stored as int32.
        return {k: np.asarray(v, np.int32 if k == "act" else v.dtype) for k, v in rows.items()}

    @classmethod
    def convert(cls, t: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"item": {k: v[None, None] for k, v in cls._host(t).items()}}  # (add batch 1, time 1, ...)

    def add(self, item: Any) -> None:
        self.state = self._add(self.state, item)

    def sample(self, n: int) -> dict[str, Any]:
        self.key, experience, indexes, weights = self._sample(self.state, self.key)
        return {"indexes": indexes, "weights": np.asarray(weights), "batch": experience}

    def update_priorities(self, indexes: Any, priorities: np.ndarray) -> None:
        self.state = self._set(self.state, indexes, priorities)

    def fill(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        for rows, _ in _chunks(columns, priorities):
            self.state = self._add(self.state, {k: v[None] for k, v in self._host(rows).items()})
        self.state = self._set(self.state, np.arange(len(priorities)), priorities)


def _same(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return t


def _make_numba(capacity: int, seed: int) -> Any:
    return numba_tree.NumbaPER(capacity, seed, env_dict(None), ALPHA, BETA, EPS)


CONTENDERS: dict[str, Contender] = {
    "mpreplay": Contender(_make_mpreplay, _same, _fill_by_add),
    "cpprb": Contender(_make_cpprb, as_cpprb, _fill_cpprb),
    "floor": Contender(Floor, _same, lambda rb, columns, priorities: None),
    "tianshou": Contender(_Tianshou, _Tianshou.convert, _Tianshou.fill),
    "torchrl": Contender(_TorchRL, _TorchRL.convert, _TorchRL.fill),
    "flashbax": Contender(_Flashbax, _Flashbax.convert, _Flashbax.fill),
    "numba": Contender(_make_numba, _same, lambda rb, columns, priorities: rb.fill(columns, priorities)),
}
# The distribution whose version names each library, and what else its figures depend on.
_DISTRIBUTIONS = {
    "mpreplay": ["mpreplay", "numpy"],
    "cpprb": ["cpprb", "numpy"],
    "floor": ["numpy"],
    "tianshou": ["tianshou", "numpy", "numba", "torch"],
    "torchrl": ["torchrl", "tensordict", "torch"],
    "flashbax": ["flashbax", "jax", "jaxlib"],
    "numba": ["numba", "numpy"],
    "reverb": ["dm-reverb", "tensorflow-cpu", "numpy"],
}
_IMPORTS = {
    "mpreplay": "mpreplay",
    "cpprb": "cpprb",
    "floor": "numpy",
    "tianshou": "tianshou.data",
    "torchrl": "torchrl.data",
    "flashbax": "flashbax",
    "numba": "numba",
    "reverb": "reverb",
}


# -- the worker -------------------------------------------------------------------------------
class Worker:
    """One contender's commands; its state (the buffer being timed) lives between them."""

    def __init__(self, name: str):
        self.name = name
        self.per: Any = None
        self.per_work: tuple[list[dict[str, Any]], list[np.ndarray]] | None = None
        self.frames: Any = None  # the buffer of a tput_ or seq_ command (peer_frames)
        self.mp: Any = None  # the buffer of the mp_ commands (peer_mp.MpSide)
        self.actor: Any = None  # the actor_ commands' library side and its script (peer_actor)

    def hello(self) -> dict[str, Any]:
        import importlib
        from importlib.metadata import PackageNotFoundError, version

        with warnings.catch_warnings():  # what a library says as it loads (TensorFlow's notices) is no answer
            warnings.simplefilter("ignore")
            importlib.import_module(_IMPORTS[self.name])
        versions = {}
        for dist in _DISTRIBUTIONS[self.name]:
            try:
                versions[dist] = version(dist)
            except PackageNotFoundError:
                versions[dist] = getattr(sys.modules.get(dist), "__version__", "not installed")
        threads = None
        if "torch" in sys.modules:
            threads = sys.modules["torch"].get_num_threads()
        return {"versions": versions, "python": sys.version.split()[0], "torch_threads": threads}

    def per_build(self, capacity: int, seed: int) -> dict[str, Any]:
        """A buffer of ``capacity`` rows, full, with random priorities, warmed up by a few frames."""
        contender = CONTENDERS[self.name]
        self.per = None
        gc.collect()
        start = time.perf_counter()
        pool, noise = workload(seed)
        buffer = contender.make(capacity, seed)
        rng = np.random.default_rng(seed)
        rows = np.arange(capacity) % len(pool)
        columns = {k: np.stack([t[k] for t in pool])[rows] for k in pool[0]}
        contender.fill(buffer, columns, rng.uniform(0.01, 1.0, capacity))
        items = [contender.convert(t) for t in pool]
        drive(buffer, 2 * BATCH, items, noise, first_sample=0)  # compiles what is compiled lazily
        self.per, self.per_work = buffer, (items, noise)
        return {"seconds": time.perf_counter() - start}

    def per_run(self, frames: int, min_cpu: float = 0.0) -> dict[str, Any]:
        """Runs of ``frames`` frames of the loop on the full buffer until they took ``min_cpu``
        CPU seconds of this process (a fast buffer's round is then not a few ms that one
        interruption can double): the CPU seconds and the frames."""
        if self.per is None or self.per_work is None:  # built together by per_build
            raise RuntimeError("per_run needs a per_build first")
        items, noise = self.per_work
        cpu, done = 0.0, 0
        while done == 0 or cpu < min_cpu:
            cpu += timed_drive(self.per, frames, items, noise, first_sample=0)
            done += frames
        return {"cpu": cpu, "frames": done}

    def tput_build(self, capacity: int, layout: str, seed: int) -> dict[str, Any]:
        self.frames = None
        gc.collect()
        self.frames = peer_frames.transitions_buffer(self.name, layout, capacity, seed)
        return {"variants": list(self.frames.variants), "note": self.frames.note}

    def tput_run(self, calls: int, variant: str) -> dict[str, Any]:
        if self.frames is None:
            raise RuntimeError("tput_run needs a tput_build first")
        return self.frames.run(calls, variant)

    def seq_build(self, capacity: int, batch: int, mean_length: int, seed: int) -> dict[str, Any]:
        self.frames = None
        gc.collect()
        self.frames = peer_frames.slice_buffer(capacity, batch, mean_length, seed)
        return {"memory": self.frames.memory()}

    def seq_run(self, calls: int) -> dict[str, Any]:
        if self.frames is None:
            raise RuntimeError("seq_run needs a seq_build first")
        return self.frames.run(calls, "new")

    def mp_open(self, obs: dict[str, Any], batch: int) -> dict[str, Any]:
        if self.mp is None:
            self.mp = peer_mp.MpSide(self.name)
        return self.mp.open(obs, batch)

    def mp_case(self, writers: int, learner: bool, rows: int, timing: dict[str, Any]) -> dict[str, Any]:
        if self.mp is None:
            raise RuntimeError("mp_case needs an mp_open first")
        return self.mp.case(writers, learner, rows, timing)

    def mp_close(self) -> dict[str, Any]:
        return {} if self.mp is None else self.mp.close()

    def queue_case(
        self, writers: int, steps: int, frame: list[int], size: int, timing: dict[str, Any]
    ) -> dict[str, Any]:
        if self.name != "reverb":
            raise ValueError(f"bench queue runs Reverb's Queue table only, not {self.name!r}")
        return peer_mp.queue_case(writers, steps, frame, size, timing)

    def sharded_case(self, shards: int, obs: dict[str, Any], batch: int, timing: dict[str, Any]) -> dict[str, Any]:
        if self.name != "reverb":
            raise ValueError(f"bench sharded runs Reverb's servers only, not {self.name!r}")
        return peer_mp.sharded_case(shards, obs, batch, timing)

    def actor_build(self, script: str, capacity: int) -> dict[str, Any]:
        self.actor_close()
        self.actor = (peer_actor.make(self.name, capacity), script, peer_actor.load_script(script))
        return {}

    def actor_run(self) -> dict[str, Any]:
        if self.actor is None:
            raise RuntimeError("actor_run needs an actor_build first")
        return peer_actor.play(*self.actor)

    def actor_close(self) -> dict[str, Any]:
        if self.actor is not None:
            actor, self.actor = self.actor[0], None
            actor.close()
        return {}


COMMANDS = (
    "hello",
    "per_build",
    "per_run",
    "tput_build",
    "tput_run",
    "seq_build",
    "seq_run",
    "mp_open",
    "mp_case",
    "mp_close",
    "queue_case",
    "sharded_case",
    "actor_build",
    "actor_run",
    "actor_close",
)


def serve(name: str, requests: Any, answers: Any) -> None:
    """Answer ``requests`` (lines of JSON) on ``answers`` until ``quit`` or end of input."""
    worker = Worker(name)
    try:
        for line in requests:
            request = json.loads(line)
            command = request.pop("cmd")
            if command == "quit":
                break
            try:
                if command not in COMMANDS:
                    raise ValueError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
                answer = {"ok": True, **getattr(worker, command)(**request)}
            except Exception as exc:  # the parent reports it as the contender's reason
                traceback.print_exc()
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
    finally:  # a server and a case's processes end with the worker
        worker.mp_close()
        worker.actor_close()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or argv[0] not in _IMPORTS:
        print(f"usage: peer_worker.py {{{','.join(_IMPORTS)}}}", file=sys.stderr)
        return 2
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what libraries print goes to stderr
    serve(argv[0], sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
