"""The peers' side of ``bench mp --peers`` and ``bench queue --peers``: one library's buffer and its case's
processes, driven from a worker (:mod:`mpreplay.bench.peer_worker`'s ``mp_*`` and ``queue_case``
commands) in that library's venv.

A case's processes are timed by :mod:`mpreplay.bench.case_clock`, as mpreplay's are, and the
worker answers with what they reported (:func:`window_json`); the benchmark makes its table's line
of that (:func:`mpreplay.bench.mp_processes.summarize`).  Every process a case starts -- Reverb's
server included -- counts in its CPU time.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from typing import Any

if __package__:  # imported as mpreplay.bench.peer_mp
    from . import reverb_roles, torchrl_roles
    from .case_clock import REPLY_TIMEOUT, Timing, Window, receive, run_window, stop
    from .mp_workloads import Obs
else:  # loaded by path by peer_worker, which registered its neighbours under these names
    import reverb_roles  # type: ignore[no-redef,import-not-found]
    import torchrl_roles  # type: ignore[no-redef,import-not-found]
    from case_clock import REPLY_TIMEOUT, Timing, Window, receive, run_window, stop  # type: ignore[no-redef,import-not-found]
    from mp_workloads import Obs  # type: ignore[no-redef,import-not-found]

MP_PEERS = ("reverb", "torchrl")


def window_json(window: Window) -> dict[str, Any]:
    return {
        "marks": window.marks,
        "reports": [{"counts": r.counts, "cpu": r.cpu, "faults": r.faults} for r in window.reports],
        "busy": list(window.busy),
        "watched": [None if w is None else list(w) for w in window.watched],
    }


class _Server:
    """Reverb's server in a process of its own."""

    def __init__(self, ctx: Any, kind: str, max_size: int, fields: dict[str, Any]):
        mine, theirs = ctx.Pipe()
        self.process = ctx.Process(
            target=reverb_roles.serve, args=(kind, max_size, fields, theirs), name="reverb server", daemon=True
        )
        self.process.start()
        theirs.close()
        self._conn = mine
        port, self.pid = receive(mine, self.process)
        self.address = f"localhost:{port}"

    def close(self) -> None:
        try:
            self._conn.send("stop")
            self.process.join(30)
        except (BrokenPipeError, OSError):
            pass
        stop([self.process])
        self._conn.close()


class MpSide:
    """One library's buffer for ``bench mp``'s cases: opened (made and filled) once per observation."""

    def __init__(self, name: str):
        if name not in MP_PEERS:
            raise ValueError(f"bench mp runs no {name!r} side; expected one of {', '.join(MP_PEERS)}")
        self.name = name
        self.ctx = multiprocessing.get_context("spawn")
        self.obs: Obs | None = None
        self.server: _Server | None = None
        self.buffer: Any = None
        self.scratch: str | None = None
        self.note = ""

    def open(self, obs: dict[str, Any], batch: int) -> dict[str, Any]:
        self.close()
        self.obs = Obs(obs["label"], tuple(obs["shape"]), obs["dtype"], obs["capacity"])
        self.batch = batch
        if self.name == "reverb":
            self.server = _Server(self.ctx, "prioritized", self.obs.capacity, reverb_roles.transition_fields(self.obs))
            stored = _fill(self.ctx, self.server.address, self.obs)
            self.note = "Table(Prioritized(0.6), Fifo, MinSize(1)); TrajectoryWriter; TrajectoryDataset"
            return {"stored": stored, "note": self.note}
        self.scratch = tempfile.mkdtemp(prefix="mpreplay-torchrl-")
        self.buffer = torchrl_roles.make_buffer(self.obs, self.obs.capacity, batch, self.scratch)
        self.note = "TensorDictPrioritizedReplayBuffer(sync=False, shared=True), LazyMemmapStorage"
        return {"stored": len(self.buffer), "note": self.note}

    def case(self, writers: int, learner: bool, rows: int, timing: dict[str, Any]) -> dict[str, Any]:
        if self.obs is None:
            raise RuntimeError("mp_case needs an mp_open first")
        clock = Timing(**timing)
        local = None
        if self.name == "reverb":
            assert self.server is not None  # made by open
            address = self.server.address
            children: list[Any] = [
                (f"writer {i}", reverb_roles.writer, (address, self.obs, rows, 10 + i)) for i in range(writers)
            ]
            if learner:
                children.append(("learner", reverb_roles.learner, (address, self.batch, 99)))
            window = run_window(self.ctx, children, clock, watch=[self.server.pid])
        else:
            children = [
                (f"writer {i}", torchrl_roles.writer, (self.buffer, self.obs, rows, 10 + i)) for i in range(writers)
            ]
            if learner:  # the process that made the buffer owns the priority tree: it is the learner
                local = (torchrl_roles.learner_op(self.buffer, 99, self.batch), 1)
            window = run_window(self.ctx, children, clock, local=local)
        return window_json(window)

    def close(self) -> dict[str, Any]:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.buffer = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        return {}


def _fill(ctx: Any, address: str, obs: Obs) -> int:
    mine, theirs = ctx.Pipe()
    filler = ctx.Process(target=reverb_roles.fill, args=(address, obs, obs.capacity, theirs), name="fill")
    filler.start()
    theirs.close()
    try:
        return int(receive(mine, filler, max(REPLY_TIMEOUT, obs.capacity * 5e-3)))
    finally:
        stop([filler])
        mine.close()


def sharded_case(shards: int, obs: dict[str, Any], batch: int, timing: dict[str, Any]) -> dict[str, Any]:
    """``shards`` Reverb servers, each filled and written by a writer of its own (1 transition a call),
    and one learner drawing from them all (:func:`mpreplay.bench.reverb_roles.sharded_learner`)."""
    ctx = multiprocessing.get_context("spawn")
    shape = Obs(obs["label"], tuple(obs["shape"]), obs["dtype"], obs["capacity"])
    servers: list[_Server] = []
    try:
        for _ in range(shards):
            servers.append(_Server(ctx, "prioritized", shape.capacity, reverb_roles.transition_fields(shape)))
            _fill(ctx, servers[-1].address, shape)
        addresses = [s.address for s in servers]
        children: list[Any] = [
            (f"writer {i}", reverb_roles.writer, (address, shape, 1, 10 + i)) for i, address in enumerate(addresses)
        ]
        children.append(("learner", reverb_roles.sharded_learner, (addresses, batch, 99)))
        window = run_window(ctx, children, Timing(**timing), watch=[s.pid for s in servers])
    finally:
        for server in servers:
            server.close()
    return window_json(window)


def queue_case(writers: int, steps: int, frame: list[int], size: int, timing: dict[str, Any]) -> dict[str, Any]:
    """Reverb's ``Queue(size)`` table: ``writers`` processes push rollouts of ``steps`` steps, one learner
    takes each once; the window, and how many rollouts the learner was handed twice."""
    ctx = multiprocessing.get_context("spawn")
    shape = tuple(frame)
    server = _Server(ctx, "queue", size, reverb_roles.rollout_fields(steps, shape))
    duplicates = ctx.Value("l", 0)
    try:
        children: list[Any] = [
            (f"writer {i}", reverb_roles.rollout_writer, (server.address, steps, shape, i)) for i in range(writers)
        ]
        children.append(("learner", reverb_roles.rollout_learner, (server.address, duplicates)))
        window = run_window(ctx, children, Timing(**timing), watch=[server.pid])
    finally:
        server.close()
    return {**window_json(window), "duplicates": int(duplicates.value), "pid": os.getpid()}
