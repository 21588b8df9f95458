"""Reverb's side of ``bench mp --peers`` and ``bench queue --peers``: its server and its clients, each a process.

Run by the Reverb venv's interpreter (``DIR/reverb``, see :mod:`mpreplay.bench.peers`), loaded by
path from :mod:`mpreplay.bench.peer_worker`: numpy and the standard library at the top, Reverb and
TensorFlow imported in the processes that use them (each started with ``spawn``: gRPC's threads do
not survive a fork).  Used as Reverb's documentation shows:

* the server, in a process of its own: one ``reverb.Table`` -- ``Prioritized(0.6)`` sampler,
  ``Fifo`` remover, ``MinSize(1)`` -- or ``Table.queue(name, size)``, with the data's signature;
* a writer: ``client.trajectory_writer``; per transition one ``append`` and one ``create_item``
  referencing that step; after each call's items ``flush(block_until_num_items=IN_FLIGHT)``, so the
  writer runs at most ``IN_FLIGHT`` items ahead of the server (the documentation's way to flush);
  the writer finalizes and compresses each chunk (zstd) before it sends it: chunk compression is
  always on in the ``TrajectoryWriter``;
* the learner: a ``TrajectoryDataset`` from the table's signature, ``max_in_flight_samples_per_worker``
  = 2 batches (samples fetched ahead while the learner works), ``.batch(B)``; each step takes a
  batch and sends ``client.mutate_priorities(table, {key: priority})`` for its items.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

if __package__:  # imported as mpreplay.bench.reverb_roles
    from .case_clock import serve_window
    from .mp_workloads import ALPHA, POOL, Obs, adds, env_dict
else:  # loaded by path by peer_worker, which registered its neighbours under these names
    from case_clock import serve_window  # type: ignore[no-redef,import-not-found]
    from mp_workloads import ALPHA, POOL, Obs, adds, env_dict  # type: ignore[no-redef,import-not-found]

TABLE = "replay"
IN_FLIGHT = 32  # items a writer may have sent but not seen confirmed
# A queue's writer (queue full) or learner (queue empty) waiting this long gives up its call: at the
# end of the window the other side has stopped.
QUEUE_TIMEOUT_MS = 5_000
FILL_ROWS = 32  # transitions per call while filling


def signature(fields: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, Any]:
    import tensorflow as tf

    return {name: tf.TensorSpec(shape, dtype) for name, (shape, dtype) in fields.items()}


def transition_fields(obs: Obs) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each field of ``bench mp``'s transition, as a step of one row."""
    return {
        name: (tuple(spec.get("shape", ())), np.dtype(spec["dtype"]).name) for name, spec in env_dict(obs, ()).items()
    }


def serve(kind: str, max_size: int, fields: dict[str, Any], conn: Connection) -> None:
    """The server's process: a table of ``kind`` (``prioritized`` or ``queue``); sends its port and
    its pid, serves until told to stop (or until the parent is gone)."""
    import os

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import reverb
    from reverb.platform import checkpointers_lib

    spec = signature({name: (tuple(shape), dtype) for name, (shape, dtype) in fields.items()})
    if kind == "queue":
        table = reverb.Table.queue(TABLE, max_size=max_size, signature=spec)
    else:
        table = reverb.Table(
            TABLE,
            sampler=reverb.selectors.Prioritized(ALPHA),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=spec,
        )
    with tempfile.TemporaryDirectory(prefix="mpreplay-reverb-") as checkpoints:  # Reverb's default is /tmp's
        server = reverb.Server([table], port=None, checkpointer=checkpointers_lib.DefaultCheckpointer(checkpoints))
        try:
            conn.send((server.port, os.getpid()))
            with contextlib.suppress(EOFError):
                conn.recv()
        finally:
            server.stop()
            conn.close()


def _rows(obs: Obs, k: int, seed: int) -> list[list[dict[str, np.ndarray]]]:
    """``bench mp``'s adds of ``k`` transitions, each as ``k`` steps of exact dtypes."""
    fields = transition_fields(obs)
    pool = []
    for add in adds(obs, k, (), seed):
        columns = {name: np.asarray(add[name], dtype) for name, (_, dtype) in fields.items()}
        if k == 1:
            pool.append([columns])
        else:
            pool.append([{name: column[i] for name, column in columns.items()} for i in range(k)])
    return pool


def _writer_op(address: str, obs: Obs, k: int, seed: int) -> Callable[[], None]:
    import reverb

    client = reverb.Client(address)
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    calls = itertools.cycle(_rows(obs, k, seed))
    append, create_item, flush = writer.append, writer.create_item, writer.flush
    names = list(transition_fields(obs))

    def write() -> None:
        for step in next(calls):
            append(step)
            history = writer.history
            create_item(TABLE, priority=1.0, trajectory={name: history[name][-1] for name in names})
        flush(block_until_num_items=IN_FLIGHT)

    return write


def fill(address: str, obs: Obs, rows: int, conn: Connection) -> None:
    """A process that inserts ``rows`` transitions, then reports how many the table holds."""
    import reverb

    write = _writer_op(address, obs, FILL_ROWS, seed=1)
    for _ in range(-(-rows // FILL_ROWS)):
        write()
    client = reverb.Client(address)
    conn.send(int(client.server_info()[TABLE].current_size))
    conn.close()


def writer(address: str, obs: Obs, k: int, seed: int, conn: Connection) -> None:
    serve_window(conn, lambda: (_writer_op(address, obs, k, seed), 1))


def learner(address: str, batch: int, seed: int, conn: Connection) -> None:
    def build() -> tuple[Callable[[], None], int]:
        import reverb

        client = reverb.Client(address)
        dataset = reverb.TrajectoryDataset.from_table_signature(
            address, TABLE, max_in_flight_samples_per_worker=2 * batch
        ).batch(batch)
        samples = iter(dataset)
        priorities = itertools.cycle(np.random.default_rng(seed).uniform(0.01, 2.0, (POOL, batch)).tolist())
        mutate = client.mutate_priorities

        def learn() -> None:
            sample = next(samples)
            mutate(TABLE, updates=dict(zip(sample.info.key.numpy().tolist(), next(priorities), strict=True)))

        for _ in range(3):  # the dataset's first batches start its workers and trace its graph
            learn()
        return learn, 1

    serve_window(conn, build)


def sharded_learner(addresses: list[str], batch: int, seed: int, conn: Connection) -> None:
    """A learner over several servers: each step takes ``batch // len(addresses)`` items from each
    server's ``TrajectoryDataset`` and sends each server its ``mutate_priorities`` (Reverb has no
    client that splits a batch over servers by their priority mass: this is the nearest a user gets)."""

    def build() -> tuple[Callable[[], None], int]:
        import reverb

        share = batch // len(addresses)
        streams = [
            (
                iter(
                    reverb.TrajectoryDataset.from_table_signature(
                        address, TABLE, max_in_flight_samples_per_worker=2 * share
                    ).batch(share)
                ),
                reverb.Client(address).mutate_priorities,
            )
            for address in addresses
        ]
        priorities = itertools.cycle(np.random.default_rng(seed).uniform(0.01, 2.0, (POOL, share)).tolist())

        def learn() -> None:
            for samples, mutate in streams:
                sample = next(samples)
                mutate(TABLE, updates=dict(zip(sample.info.key.numpy().tolist(), next(priorities), strict=True)))

        for _ in range(3):  # the datasets' first batches start their workers and trace their graphs
            learn()
        return learn, 1

    serve_window(conn, build)


# -- bench queue: rollouts through a Queue(size) table ---------------------------------------
def rollout_fields(steps: int, frame: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    """A rollout's item: ``steps`` steps of a frame and small fields; ``writer`` and ``number`` name it."""
    return {
        "obs": ((steps, *frame), "uint8"),
        "act": ((steps,), "int64"),
        "rew": ((steps,), "float32"),
        "done": ((steps,), "float32"),
        "writer": ((steps,), "int64"),
        "number": ((steps,), "int64"),
    }


def rollout_writer(address: str, steps: int, frame: tuple[int, ...], writer_id: int, conn: Connection) -> None:
    """Appends ``steps`` steps and inserts them as one item, then waits for the server's confirmation
    (``end_episode``), as an on-policy actor hands over each rollout."""

    def build() -> tuple[Callable[[], None], int]:
        import reverb

        client = reverb.Client(address)
        writer = client.trajectory_writer(num_keep_alive_refs=steps)
        rng = np.random.default_rng(writer_id)
        frames = rng.integers(0, 256, (steps, *frame), dtype=np.uint8)
        act = rng.integers(0, 6, steps).astype(np.int64)
        rew = rng.standard_normal(steps).astype(np.float32)
        done = np.zeros(steps, np.float32)
        ident = np.int64(writer_id)
        numbers = itertools.count()
        names = list(rollout_fields(steps, frame))

        def push() -> None:
            number = np.int64(next(numbers))
            for t in range(steps):
                writer.append(
                    {"obs": frames[t], "act": act[t], "rew": rew[t], "done": done[t], "writer": ident, "number": number}
                )
            writer.create_item(TABLE, priority=1.0, trajectory={name: writer.history[name][-steps:] for name in names})
            with contextlib.suppress(reverb.errors.DeadlineExceededError):
                writer.end_episode(timeout_ms=QUEUE_TIMEOUT_MS)

        return push, 1

    serve_window(conn, build)


def rollout_learner(address: str, seen: Any, conn: Connection) -> None:
    """Takes one rollout at a time from the queue; ``seen`` (a shared counter pair) records rollouts
    taken twice: the queue hands each out once."""

    def build() -> tuple[Callable[[], None], int]:
        import reverb

        dataset = reverb.TrajectoryDataset.from_table_signature(
            address, TABLE, max_in_flight_samples_per_worker=1, rate_limiter_timeout_ms=QUEUE_TIMEOUT_MS
        )
        rollouts = iter(dataset)
        taken: set[tuple[int, int]] = set()

        def take() -> None:
            sample = next(rollouts, None)  # None: the queue stayed empty (the writers have stopped)
            if sample is None:
                return
            data = sample.data
            ident = (int(data["writer"][0]), int(data["number"][0]))
            if ident in taken:
                seen.value += 1
            taken.add(ident)

        return take, 1

    serve_window(conn, build)


# -- bench apex: the actor's loop through Acme's n-step transition adder -------------------------
def actor_fields(depth: int = 4) -> dict[str, tuple[tuple[int, ...], str]]:
    """The item of Acme's ``NStepTransitionAdder``: a transition whose reward is the n-step return."""
    stack = ((84, 84, depth), "uint8")
    return {
        "observation": stack,
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "discount": ((), "float32"),
        "next_observation": stack,
    }


class Actor:
    """``bench apex``'s actor loop (:mod:`peer_actor`) written as Acme's ``NStepTransitionAdder``
    writes it (one adder, so one ``TrajectoryWriter``, per game): each step appends its action,
    reward and discount (completing the step) and the next observation (a partial step); once
    ``nstep`` steps are in, the window's rewards come back from the writer's history
    (``.numpy()``), the n-step return and total discount are appended to the open step, and an
    item references the window's first observation and action, the return, the discount and the
    last observation, then ``flush(IN_FLIGHT)``; an episode's end completes the open step with zeros
    and writes the shorter windows left, then ``end_episode``.  The server is a process of its own,
    so the actor's thread is what is timed, as an actor beside a remote server runs it."""

    def __init__(self, capacity: int, nstep: int, gamma: float):
        import multiprocessing

        import reverb

        self._nstep, self._gamma = nstep, gamma
        ctx = multiprocessing.get_context("spawn")  # gRPC's threads do not survive a fork
        self._conn, theirs = ctx.Pipe()
        self._server = ctx.Process(target=serve, args=("prioritized", capacity, actor_fields(), theirs), daemon=True)
        self._server.start()
        theirs.close()
        if not self._conn.poll(120):
            self.close()
            raise TimeoutError("Reverb's server did not start within 120 s")
        port, _ = self._conn.recv()
        self._client = reverb.Client(f"localhost:{port}")
        self._writers: list[Any] = []

    def begin(self, stacks: np.ndarray, q: np.ndarray) -> None:
        self._end_writers()
        self._writers = [self._client.trajectory_writer(num_keep_alive_refs=2 * self._nstep + 2) for _ in stacks]
        for writer, stack in zip(self._writers, stacks, strict=True):
            writer.append({"observation": stack}, partial_step=True)

    def step(self, step: dict[str, np.ndarray], stacks: np.ndarray, previous: np.ndarray) -> None:
        for g, writer in enumerate(self._writers):
            if step["restart"][g]:
                writer.append({"observation": stacks[g]}, partial_step=True)
                continue
            discount = np.float32(0.0 if step["terminated"][g] else 1.0)
            current = {"action": step["act"][g], "reward": step["rew"][g], "discount": discount}
            writer.append(current)
            writer.append({"observation": stacks[g]}, partial_step=True)
            priority = float(step["priority"][g])
            if writer.episode_steps >= self._nstep:
                self._write(writer, self._nstep, priority, appended=None)
            if step["ended"][g]:
                writer.append({name: np.zeros_like(value) for name, value in current.items()})
                for appended, window in enumerate(range(min(self._nstep - 1, writer.episode_steps - 1), 0, -1)):
                    self._write(writer, window, priority, appended=appended)
                writer.end_episode()

    def _write(self, writer: Any, window: int, priority: float, appended: int | None) -> None:
        """An item of the ``window`` complete steps before the step holding the newest observation:
        the open step (``appended`` None), or, once the episode's end completed it, the step
        ``appended`` complete steps of returns back (each later window appends one)."""
        history = writer.history
        anchor = -1 if appended is None else -1 - appended  # the step holding the next observation
        first = anchor - window
        rewards = history["reward"][first:anchor].numpy()
        discounts = history["discount"][first:anchor].numpy() * self._gamma
        before = np.concatenate([[1.0], np.cumprod(discounts)[:-1]])
        returns = {
            "n_step_return": np.float32((before * rewards).sum()),
            "total_discount": np.float32(np.prod(discounts)),
        }
        writer.append(returns, partial_step=appended is None)  # a complete step of its own at the end
        history = writer.history
        moved = 0 if appended is None else 1
        writer.create_item(
            TABLE,
            priority=priority,
            trajectory={
                "observation": history["observation"][first - moved],
                "action": history["action"][first - moved],
                "reward": history["n_step_return"][-1],
                "discount": history["total_discount"][-1],
                "next_observation": history["observation"][anchor - moved],
            },
        )
        writer.flush(block_until_num_items=IN_FLIGHT)

    def _end_writers(self) -> None:
        for writer in self._writers:
            writer.end_episode()
            writer.close()
        self._writers = []

    def close(self) -> None:
        self._end_writers()
        self._conn.close()  # the server stops when its pipe closes
        self._server.join(30)
        if self._server.is_alive():
            self._server.kill()
            self._server.join()
