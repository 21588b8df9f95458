"""TorchRL's side of ``bench mp --peers``: its multi-process prioritized replay buffer as its documentation
describes it, run by the peers' venv (loaded by path from :mod:`mpreplay.bench.peer_worker`).

TorchRL's ``PrioritizedSampler`` (its C++ sum tree) cannot be shared between processes: pickling one
for a spawned process raises "Samplers of type ... cannot be shared between processes. Use
TensorDictPrioritizedReplayBuffer(sync=False) instead: the writer process gets a uniform sampler and
the learner keeps a local prioritized sampler."  That is what runs here:
``TensorDictPrioritizedReplayBuffer(sync=False, shared=True)`` over a ``LazyMemmapStorage`` (TorchRL
shares a storage between processes once it is memory-mapped or in shared memory), filled in the
process that made it; writers are processes started with ``spawn`` that are handed the buffer and
``add`` (1 row) or ``extend`` (32 rows) TensorDicts; the learner is the process that made the buffer,
the one that owns the priority tree, which catches up with what the writers wrote (at the highest
priority seen) before each ``sample``; it then sends ``update_priority(index, priorities)``.  The
writers' rows carry no priority of their own: only the learner's tree holds priorities.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

if __package__:  # imported as mpreplay.bench.torchrl_roles
    from .case_clock import serve_window
    from .mp_workloads import ALPHA, BETA, EPS, POOL, Obs, adds, transitions
else:  # loaded by path by peer_worker, which registered its neighbours under these names
    from case_clock import serve_window  # type: ignore[no-redef,import-not-found]
    from mp_workloads import ALPHA, BETA, EPS, POOL, Obs, adds, transitions  # type: ignore[no-redef,import-not-found]

FILL_ROWS = 10_000


def _tensordict(add: dict[str, Any], k: int) -> Any:
    import torch
    from tensordict import TensorDict

    columns = {name: torch.as_tensor(np.asarray(value)) for name, value in add.items()}
    return TensorDict(columns, [] if k == 1 else [k])


def make_buffer(obs: Obs, capacity: int, batch: int, scratch: str) -> Any:
    """The shared buffer, filled to ``capacity`` with random transitions (untimed, ``extend``)."""
    from torchrl.data import LazyMemmapStorage, TensorDictPrioritizedReplayBuffer

    buffer = TensorDictPrioritizedReplayBuffer(
        alpha=ALPHA,
        beta=BETA,
        eps=EPS,
        storage=LazyMemmapStorage(capacity, scratch_dir=scratch),
        sync=False,
        shared=True,
        batch_size=batch,
    )
    pool = transitions(obs, min(FILL_ROWS, capacity), (), seed=1)
    for i in range(-(-capacity // FILL_ROWS)):
        buffer.extend(_tensordict(pool[i % len(pool)], min(FILL_ROWS, capacity)))
    return buffer


def writer(buffer: Any, obs: Obs, k: int, seed: int, conn: Connection) -> None:
    def build() -> tuple[Callable[[], None], int]:
        items = itertools.cycle([_tensordict(add, k) for add in adds(obs, k, (), seed)])
        write = buffer.add if k == 1 else buffer.extend

        def op() -> None:
            write(next(items))

        return op, 16 if k == 1 else 1

    serve_window(conn, build)


def learner_op(buffer: Any, seed: int, batch: int) -> Callable[[], None]:
    import torch

    priorities = itertools.cycle(
        [torch.as_tensor(p) for p in np.random.default_rng(seed).uniform(0.01, 2.0, (POOL, batch)).astype(np.float32)]
    )
    sample, update = buffer.sample, buffer.update_priority

    def learn() -> None:
        data = sample()
        update(data["index"], next(priorities))

    for _ in range(3):  # what is compiled or allocated lazily, before the window
        learn()
    return learn


# -- bench apex: the actor's loop as a TorchRL collector with MultiStep feeds its buffer ----------
ROLLOUT = 8  # steps per game in a collector's batch: 32 frames over 4 games, the demo's actor_batch


def _peer_actor() -> Any:
    """:mod:`peer_actor`, under the name it was loaded by (the peers' venvs load it by path)."""
    import importlib

    return importlib.import_module(f"{__package__}.peer_actor" if __package__ else "peer_actor")


class _Collector:
    """The writer's side: each vector step becomes the step's TensorDict (root observation,
    action; ``next``: observation, reward, done, terminated, truncated) written into the
    collector's ``[games, ROLLOUT]`` batch; a full batch goes through ``MultiStep(gamma, n_steps)``
    (the collector's ``postproc``) and is ``extend``-ed, flattened, into the buffer."""

    def __init__(self, buffer: Any, nstep: int, gamma: float):
        from torchrl.data.postprocs import MultiStep

        self._buffer, self._multistep = buffer, MultiStep(gamma=gamma, n_steps=nstep)
        self._rollout: Any = None
        self._t = 0

    @staticmethod
    def _step(stacks: np.ndarray, previous: np.ndarray, step: dict[str, np.ndarray]) -> Any:
        import torch
        from tensordict import TensorDict

        # TorchRL's envs reset inside the step that ended: the script's reset step is a row here,
        # marked truncated so that MultiStep folds nothing across it.
        truncated = step["ended"] & ~step["terminated"] | step["restart"]
        return TensorDict(
            {
                "observation": torch.from_numpy(previous),
                "action": torch.from_numpy(step["act"]),
                "next": {
                    "observation": torch.from_numpy(stacks),
                    "reward": torch.from_numpy(step["rew"]).unsqueeze(-1),
                    "done": torch.from_numpy(step["ended"] | step["restart"]).unsqueeze(-1),
                    "terminated": torch.from_numpy(step["terminated"]).unsqueeze(-1),
                    "truncated": torch.from_numpy(truncated).unsqueeze(-1),
                },
            },
            [len(stacks)],
        )

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None:
        import torch

        games = len(stacks)
        blank: dict[str, np.ndarray] = {
            "act": np.zeros(games, np.int64),
            "rew": np.zeros(games, np.float32),
            **{key: np.zeros(games, bool) for key in ("ended", "terminated", "restart")},
        }
        example = self._step(stacks, stacks, blank)
        self._rollout = torch.stack([example] * ROLLOUT, dim=1).contiguous()  # the collector's batch
        self._t = 0

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None:
        self._rollout[:, self._t] = self._step(stacks, previous, step)
        self._t += 1
        if self._t == ROLLOUT:
            self._buffer.extend(self._multistep(self._rollout).reshape(-1))
            self._t = 0

    def extend_blank(self) -> None:
        """One batch of the begun shape, written untimed: the storage exists before it is shared."""
        self._buffer.extend(self._multistep(self._rollout.clone()).reshape(-1))

    def close(self) -> None:
        self._rollout = None


def _writer(buffer: Any, directory: str, nstep: int, gamma: float, conn: Connection) -> None:
    """The actor's process: it got the buffer as ``spawn`` hands it over, runs the script each
    time it is asked, and answers with what :func:`peer_actor.run` measured."""
    peer_actor = _peer_actor()
    script = peer_actor.load_script(directory)
    collector = _Collector(buffer, nstep, gamma)
    try:
        while conn.recv() == "run":
            conn.send(peer_actor.run(collector, script))
    except EOFError:  # the worker is gone
        pass
    finally:
        conn.close()


class Actor:
    """``bench apex``'s actor loop (:mod:`peer_actor`) as a TorchRL actor runs it: a process that
    was handed ``TensorDictPrioritizedReplayBuffer(sync=False, shared=True)`` over a
    ``LazyMemmapStorage`` (``bench mp``'s shared buffer; a writer's sampler is uniform, so its rows
    carry no priorities), feeding it as a ``SyncDataCollector`` with ``postproc=MultiStep`` does
    (:class:`_Collector`).  The buffer's owner -- this process -- makes the storage with a first
    batch; the actor's process is started with ``spawn`` at the first run and runs every run."""

    def __init__(self, capacity: int, nstep: int, gamma: float):
        import tempfile

        from torchrl.data import LazyMemmapStorage, TensorDictPrioritizedReplayBuffer

        self._scratch = tempfile.TemporaryDirectory(prefix="mpreplay-torchrl-")
        self._owner = TensorDictPrioritizedReplayBuffer(
            alpha=ALPHA,
            beta=BETA,
            eps=EPS,
            storage=LazyMemmapStorage(capacity, scratch_dir=self._scratch.name),
            sync=False,
            shared=True,
        )
        self._nstep, self._gamma = nstep, gamma
        self._process: Any = None
        self._conn: Any = None

    def play(self, directory: str, script: dict[str, np.ndarray]) -> dict[str, Any]:
        """One run of the script in the actor's process (started at the first)."""
        if self._process is None:
            import multiprocessing

            first = _Collector(self._owner, self._nstep, self._gamma)
            stacks = np.repeat(script["frames"][0][..., None], _peer_actor().DEPTH, axis=-1)  # each reset's stack
            first.begin(stacks, script["q"][0])
            first.extend_blank()
            ctx = multiprocessing.get_context("spawn")
            self._conn, theirs = ctx.Pipe()
            args = (self._owner, directory, self._nstep, self._gamma, theirs)
            self._process = ctx.Process(target=_writer, args=args, daemon=True)
            self._process.start()
            theirs.close()
        self._conn.send("run")
        if not self._conn.poll(600):
            raise TimeoutError("TorchRL's actor process did not finish a run within 600 s")
        answer: dict[str, Any] = self._conn.recv()
        return answer

    def close(self) -> None:
        if self._process is not None:
            self._conn.close()  # the actor's process ends when its pipe closes
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process = None
        self._owner = None
        self._scratch.cleanup()
