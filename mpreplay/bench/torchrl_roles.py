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
