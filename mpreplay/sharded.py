"""Prioritized replay over several nodes: one shared-memory buffer per node, one client for the learner.

::

    node A: actors ─add()─> MPPrioritizedReplayBuffer <─ ShardServer (Ray actor) ─┐
    node B: actors ─add()─> MPPrioritizedReplayBuffer <─ ShardServer (Ray actor) ─┼─> ShardedReplay ─> learner
    node C: actors ─add()─> MPPrioritizedReplayBuffer <─ ShardServer (Ray actor) ─┘

Actors write into their node's shared-memory buffer exactly as on one
machine: Ray is not on the write path.  A :class:`ShardServer` per node
serves that buffer to the learner, whose :class:`ShardedReplay` has the
``sample`` / ``update_priorities`` API of a local buffer.

**Sampling.**  Each batch is split over the shards in proportion to their
total leaf weight ``T_s`` (systematic allocation: a shard's count is the
floor or the ceiling of ``B * T_s / sum T``).  Inside a shard the draw is the
buffer's own stratified draw, so transition ``i`` is drawn with probability
``v_i / sum_s T_s`` (``v_i = (p_i + eps) ** alpha``, its leaf weight): the
same as from one buffer holding every shard's data.  Every reply carries
the shard's total and minimum leaf weight, which the next splits use.
Importance weights are ``(N·P(i))^-β / max_j (N·P(j))^-β`` over all shards;
``N`` cancels, and the maximum is reached at the global minimum leaf weight.
A batch is split by the totals of the latest reply, which with prefetching
are a round trip old; the weights use the probabilities the batch was
actually drawn with (``P(i) = share_s * v_i / T_s``), which are exactly
``v_i / sum T`` whenever the totals did not move in between.

**Indexes.**  ``indexes`` are opaque non-negative int64 ids (see
:func:`split_indexes`): bits 52-62 hold the shard's id in this client, bits
32-51 the low 20 bits of the slot's write count when it was sampled (its
*generation*), bits 0-31 the slot.  ``update_priorities`` routes each
update to its shard, which drops it if the slot was overwritten since (its
generation moved); updates for a shard that is gone are dropped too.
Nothing needs to be remembered by the client, so indexes may come back in
any order and any grouping.

**Prefetching.**  The client keeps ``prefetch`` calls in flight per shard;
each call fetches ``batches_per_call`` batches, so a learner that trains
between samples rarely waits.  The price is that a batch may be drawn up to
``prefetch * batches_per_call`` batches before it is handed out, so it
misses the priority updates of that many steps.  ``prefetch=0`` fetches on
demand.  ``update_priorities`` never waits: a shard's updates ride with its
next sample call (applied before that call draws), so a learner loop costs
no extra round trips.  If ``2 * batches_per_call`` updates pile up for a shard
without a sample call to carry them, they go in a call of their own; at most
``max_updates_in_flight`` such calls are outstanding (then the oldest is
waited for).  :meth:`ShardedReplay.flush` sends and waits for everything.

**Lost and returning shards.**  A shard whose server dies (its node went
away) is dropped from the split with a :class:`ShardLostWarning`, the
batches it was part of are drawn again from the others, and sampling goes
on.  A shard server joins with :meth:`ShardedReplay.add_shard`, or by name:
with ``discover=PREFIX`` the client adds every named Ray actor whose name
starts with ``PREFIX`` at start and again every ``rediscover_every``
seconds, so a shard server started on a replacement node joins by itself.
A returning shard always gets a new id: indexes drawn before it left are
then dropped, never applied to a different buffer.

**Transports.**  ``shards`` are Ray actor handles of :class:`ShardServer`
(see :func:`start_shard_servers`), or in-process :class:`ShardServer`
objects: the same client without Ray, for tests and as a baseline.

Ray is optional (``pip install mpreplay[ray]``): importing this module does
not import it; only the code paths that need Ray do (Ray handles,
:func:`start_shard_servers`, :func:`node_buffer`).  A Ray cluster on loopback for
tests, benchmarks and trying it out: :class:`mpreplay.testing.LoopbackRayCluster`.
"""
from __future__ import annotations

import collections
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import checks
from .buffer import BufferClosed, PrioritizedReplayBuffer

__all__ = ["SHARD_NAME_PREFIX", "ShardLostWarning", "ShardServer", "ShardUnavailable",
           "ShardedReplay", "node_buffer", "split_indexes", "start_shard_servers"]

SHARD_NAME_PREFIX = "mpreplay-shard-"  # start_shard_servers names each server this + its node id

_SLOT_BITS, _TAG_BITS, _SHARD_BITS = 32, 20, 11
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_TAG_MASK = (1 << _TAG_BITS) - 1
_KEY_BITS = _SLOT_BITS + _TAG_BITS  # what a shard sees of an index: tag and slot
_KEY_MASK = (1 << _KEY_BITS) - 1
_PER_SHARD_ONLY = ("lock_holder_pid", "lock_held_seconds")  # stats() entries that do not add up across shards
_MAX_SHARD_IDS = 1 << _SHARD_BITS


class ShardLostWarning(RuntimeWarning):
    """A shard stopped answering and was dropped from the split."""


class ShardUnavailable(RuntimeError):
    """A shard server cannot be reached (its process or node is gone, or it did not answer in time)."""


def split_indexes(indexes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard_ids, slots, generation_tags)`` of indexes a :class:`ShardedReplay` returned.

    A generation tag is the low 20 bits of how many times the slot had been
    written when it was sampled.
    """
    idx = np.asarray(indexes, dtype=np.int64)
    return idx >> _KEY_BITS, idx & _SLOT_MASK, (idx >> _SLOT_BITS) & _TAG_MASK


# -- the server ----------------------------------------------------------------------------------
class ShardServer:
    """Serves one node's prioritized buffer to a :class:`ShardedReplay`.

    Run it as a Ray actor on the node that holds the buffer
    (:func:`start_shard_servers` does), or in-process for the local transport.

    Parameters
    ----------
    buffer : PrioritizedReplayBuffer, or a callable returning one
        The buffer served.  A shared buffer's handle attaches in the server's
        process (the server never unlinks it); a callable runs in the
        server's process, which then owns the buffer (and its segment) and
        releases it on :meth:`close`.  Actors on the node get a handle from
        :meth:`buffer`.

    One server is meant to be called by one thread at a time (as a Ray actor
    is, by default).
    """

    def __init__(self, buffer: PrioritizedReplayBuffer | Callable[[], PrioritizedReplayBuffer]):
        if not isinstance(buffer, PrioritizedReplayBuffer) and callable(buffer):
            buffer = buffer()
        if not isinstance(buffer, PrioritizedReplayBuffer):
            raise TypeError(f"buffer: expected a PrioritizedReplayBuffer or a callable returning one, "
                            f"got {type(buffer).__name__}")
        if buffer.get_buffer_size() > _SLOT_MASK + 1:
            raise ValueError(f"buffer: a shard holds at most {_SLOT_MASK + 1} transitions, "
                             f"got a capacity of {buffer.get_buffer_size()}")
        self._buffer = buffer
        self._stale = 0

    def buffer(self) -> PrioritizedReplayBuffer:
        """The served buffer; over Ray a shared buffer arrives as a handle
        that attaches on the caller's node (call it from that node)."""
        return self._buffer

    def describe(self) -> dict[str, Any]:
        """What a client checks before it samples: field specs, alpha, eps, capacity, the largest
        priority the buffer accepts and the current mass."""
        b = self._buffer
        return {"env_dict": b.get_env_dict(), "alpha": b.alpha, "eps": b.eps,
                "capacity": b.get_buffer_size(), "max_priority": b.max_priority, **self._mass()}

    def _mass(self) -> dict[str, Any]:
        total, smallest = self._buffer.leaf_mass()
        return {"total": total, "min": smallest, "stored": self._buffer.get_stored_size()}

    def sample(self, counts: Sequence[int], keys: np.ndarray | None = None,
               priorities: np.ndarray | None = None) -> dict[str, Any]:
        """Apply priority updates (as :meth:`update_priorities`, when ``keys`` is given),
        then draw one batch of ``counts[j]`` transitions for each ``j``.

        Returns ``{"batches": [...], "total", "min", "stored"}``: the mass
        after the draws, and per count either None (count 0, or the buffer
        holds nothing) or the fields plus ``keys`` (generation tag and slot
        of each row, see :func:`split_indexes`) and ``leaf`` (leaf weights).
        Importance weights are left to the client: they need every shard's minimum.
        """
        if keys is not None:
            self.update_priorities(keys, priorities)
        b = self._buffer
        batches: list[dict[str, np.ndarray] | None] = []
        for count in counts:
            if count < 1 or not b.leaf_mass()[0] > 0.0:
                batches.append(None)
                continue
            batch = b.sample_leaves(int(count))
            slots = batch.pop("indexes")
            batch["keys"] = ((batch.pop("tags") & _TAG_MASK) << _SLOT_BITS) | slots
            batches.append(batch)
        return {"batches": batches, **self._mass()}

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set priorities of sampled rows (``keys`` from :meth:`sample`); returns how many were dropped.

        An update is dropped when its slot was overwritten since it was
        sampled, or is being written now.
        """
        keys = np.asarray(keys, dtype=np.int64)
        slots = keys & _SLOT_MASK
        bad = np.flatnonzero((keys < 0) | (keys > _KEY_MASK) | (slots >= self._buffer.get_buffer_size()))
        if bad.size:
            raise ValueError(f"keys: expected keys from this shard's sample(), got {keys[bad[0]]} at position {bad[0]}")
        tags = self._buffer.slot_tags(slots)
        live = (tags >= 0) & ((tags & _TAG_MASK) == keys >> _SLOT_BITS)
        dropped = int(live.size - np.count_nonzero(live))
        self._stale += dropped
        self._buffer.update_priorities(slots[live], np.asarray(priorities, dtype=np.float64)[live])
        return dropped

    def stats(self) -> dict[str, float]:
        """The buffer's ``stats()``; ``stale_updates_dropped`` includes the updates this server dropped."""
        out = self._buffer.stats()
        out["stale_updates_dropped"] += self._stale
        return out

    def save_transitions(self, *args: Any, **kwargs: Any) -> Any:
        """``buffer.save_transitions(*args, **kwargs)``: the file is written on the server's node."""
        save = getattr(self._buffer, "save_transitions", None)
        if save is None:
            raise NotImplementedError("save_transitions: this version's buffers cannot save transitions")
        return save(*args, **kwargs)

    def node_id(self) -> str | None:
        """The Ray node this server runs on (None outside Ray)."""
        try:
            import ray
        except ImportError:
            return None
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None

    def close(self) -> None:
        """Release the buffer (unlinking its segment if this server created it)."""
        self._buffer.close()


# -- transports ----------------------------------------------------------------------------------
class _Done:
    """A local call, already made: its value or its exception."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error


class _LocalLink:
    """Calls an in-process server directly; a closed buffer means the shard is gone."""

    def __init__(self, server: ShardServer):
        self.server = server
        self.key: Any = id(server)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> _Done:
        try:
            return _Done(getattr(self.server, method)(*args, **kwargs))
        except BufferClosed as exc:
            return _Done(error=ShardUnavailable(str(exc)))

    def wait(self, pending: _Done, timeout: float | None) -> Any:
        if pending.error is not None:
            raise pending.error
        return pending.value

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.wait(self.submit(method, *args), timeout)


class _RayLink(_LocalLink):
    """Calls a server actor with Ray: ``submit`` returns an object ref."""

    def __init__(self, handle: Any):
        self.server = handle
        self.key = handle._actor_id.hex()

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.server, method).remote(*args, **kwargs)

    def wait(self, pending: Any, timeout: float | None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(pending, timeout=timeout)
        except (RayActorError, BufferClosed) as exc:
            raise ShardUnavailable(str(exc).splitlines()[0]) from None
        except GetTimeoutError:
            raise ShardUnavailable(f"no answer within {timeout} s") from None


def _link(shard: Any) -> _LocalLink:
    if isinstance(shard, ShardServer):
        return _LocalLink(shard)
    try:
        from ray.actor import ActorHandle
    except ImportError:
        ActorHandle = ()  # without Ray nothing is a handle
    if isinstance(shard, ActorHandle):
        return _RayLink(shard)
    raise TypeError(f"shard: expected a ShardServer or a Ray actor handle of one, got {type(shard).__name__}")


# -- the client ----------------------------------------------------------------------------------
@dataclass
class _Shard:
    id: int
    link: _LocalLink
    total: float
    min: float
    stored: int
    capacity: int
    max_priority: float  # the largest priority its buffer accepts
    updates: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # not sent yet

    def take_updates(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The updates not sent yet, as ``(keys, priorities)`` (``(None, None)`` when there are none)."""
        if not self.updates:
            return None, None
        keys, priorities = (np.concatenate(a) for a in zip(*self.updates))
        self.updates.clear()
        return keys, priorities


@dataclass
class _Round:
    """One call to each shard for several batches, split by the shares known at launch."""

    shards: list[_Shard]
    shares: np.ndarray  # (shards,)
    counts: np.ndarray  # (batches, shards)
    calls: list[Any] = field(default_factory=list)  # one per shard, made with its link
    carried: list[int] = field(default_factory=list)  # priority updates riding with each shard's call


@dataclass
class _Batch:
    """Rows drawn for one batch, waiting for their importance weights."""

    rows: dict[str, np.ndarray]
    indexes: np.ndarray
    probabilities: np.ndarray
    min_probability: float


def _split(shares: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """How many of ``k`` draws each shard gets: systematic sampling over the shares, so the
    expected count is exactly ``k * share`` and the actual one its floor or ceiling."""
    edges = np.cumsum(shares)
    edges /= edges[-1]
    edges[-1] = 1.0  # every position < 1 lands in a shard, never past a last empty one
    positions = (np.arange(k) + rng.random()) / k
    return np.bincount(np.searchsorted(edges, positions, side="right"), minlength=len(shares))


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1 and parts[0].flags.writeable:
        return parts[0]
    # Parts arriving over Ray are read-only views of its object store: copy.
    return np.concatenate(parts)


class ShardedReplay:
    """A learner's prioritized replay over several shard servers, with a local buffer's API.

    Parameters
    ----------
    shards : iterable
        :class:`ShardServer` objects (local transport) or Ray actor handles of
        servers.  More can join later (:meth:`add_shard`, ``discover``).
    prefetch : int
        Calls kept in flight per shard (0: fetch when ``sample`` is called).
    batches_per_call : int
        Batches each call fetches: more amortises the round trip.
    max_updates_in_flight : int
        Calls carrying only priority updates that may be outstanding before ``update_priorities`` waits.
    timeout : float, optional
        A shard that does not answer within this many seconds is dropped
        (None: only when Ray reports it dead; 0: one whose answer is not
        there yet when the client looks).
    discover : str, optional
        Name prefix of Ray shard servers to add by name (e.g. :data:`SHARD_NAME_PREFIX`),
        at start and every ``rediscover_every`` seconds during ``sample``.
    namespace : str, optional
        Ray namespace of those names (default: the driver's).
    rediscover_every : float
        Seconds between two look-ups of named shard servers (with ``discover``).
    seed : int, optional
        Seed of the split between shards.

    See the module documentation for the sampling math, the index format and
    what happens when shards come and go.  A client is meant for one thread.
    """

    def __init__(self, shards: Iterable[Any] = (), *, prefetch: int = 2, batches_per_call: int = 8,
                 max_updates_in_flight: int = 16, timeout: float | None = None, discover: str | None = None,
                 namespace: str | None = None, rediscover_every: float = 10.0, seed: int | None = None):
        self._prefetch = checks.integer("prefetch", prefetch, low=0)
        self._per_call = checks.integer("batches_per_call", batches_per_call, low=1)
        self._max_updates = checks.integer("max_updates_in_flight", max_updates_in_flight, low=1)
        self._timeout = checks.seconds("timeout", timeout)
        if discover is not None and not isinstance(discover, str):
            raise TypeError(f"discover: expected a name prefix (str), got {type(discover).__name__}")
        self._discover, self._namespace = discover, namespace
        self._rediscover_every = checks.seconds("rediscover_every", rediscover_every, allow_none=False)
        self._rng = np.random.default_rng(seed)
        self._shards: dict[int, _Shard] = {}
        self._next_id = 0
        self._spec: dict[str, Any] | None = None
        self._rounds: collections.deque[_Round] = collections.deque()
        self._ready: collections.deque[_Batch] = collections.deque()
        self._batch_size = 0
        self._updates: collections.deque[tuple[_Shard, Any, int]] = collections.deque()
        self._lost = 0
        self._lost_updates = 0
        self._last_discovery = -np.inf
        for shard in shards:
            self.add_shard(shard)
        if discover is not None:
            self.discover()

    # -- membership ----------------------------------------------------------------------------
    def add_shard(self, shard: Any) -> int:
        """Add a shard server (a :class:`ShardServer` or a Ray handle of one); returns its id.

        A server already present keeps its id.  Its buffer must have the
        same fields, alpha and eps as the others'.  Raises
        :class:`ShardUnavailable` if the server does not answer.
        """
        link = _link(shard)
        for s in self._shards.values():
            if s.link.key == link.key:
                return s.id
        if self._next_id >= _MAX_SHARD_IDS:
            raise RuntimeError(f"add_shard: this client has used all {_MAX_SHARD_IDS} shard ids; make a new client")
        info = link.call("describe", timeout=self._timeout)
        spec = {k: info[k] for k in ("env_dict", "alpha", "eps")}
        if self._spec is None:
            self._spec = spec
        elif spec != self._spec:
            raise ValueError(f"shard: its buffer has {spec}, the other shards' have {self._spec}")
        sid, self._next_id = self._next_id, self._next_id + 1
        self._shards[sid] = _Shard(sid, link, info["total"], info["min"], info["stored"], info["capacity"],
                                   info["max_priority"])
        self._discard_prefetched()  # they were split without the new shard
        return sid

    def discover(self) -> list[int]:
        """Add every live Ray shard server named with the ``discover`` prefix; returns the new ids."""
        import ray

        if self._discover is None:
            raise ValueError("discover: this client was made without a name prefix (discover=...)")
        self._last_discovery = time.monotonic()
        namespace = self._namespace or ray.get_runtime_context().namespace
        known = {s.link.key for s in self._shards.values()}
        added = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] != namespace or not entry["name"].startswith(self._discover):
                continue
            try:
                handle = ray.get_actor(entry["name"], namespace=namespace)
            except ValueError:  # it died since it was listed
                continue
            if handle._actor_id.hex() in known:
                continue
            try:
                added.append(self.add_shard(handle))
            except ShardUnavailable:
                continue
        return added

    def shard_ids(self) -> list[int]:
        """Ids of the shards sampled from now."""
        return sorted(self._shards)

    def _drop(self, shard: _Shard, reason: str) -> None:
        if self._shards.pop(shard.id, None) is None:
            return
        self._lost += 1
        self._lost_updates += sum(len(keys) for keys, _ in shard.updates)
        warnings.warn(f"shard {shard.id} is gone ({reason}); sampling goes on over {len(self._shards)} shard(s)",
                      ShardLostWarning, stacklevel=3)

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions over all shards in proportion to their priority.

        Returns the fields plus ``indexes`` (see :func:`split_indexes`) and
        importance ``weights`` = (N·P(i))^-β / max_j (N·P(j))^-β over all shards.
        """
        batch_size, beta = checks.integer("batch_size", batch_size, low=1), checks.number("beta", beta, low=0.0)
        if batch_size != self._batch_size:
            self._discard_prefetched()
            self._batch_size = batch_size
        if self._discover is not None and time.monotonic() - self._last_discovery >= self._rediscover_every:
            self.discover()
        while not self._ready:
            if not self._rounds:
                self._launch(self._per_call)
            self._collect(self._rounds.popleft())
        while len(self._rounds) < self._prefetch:
            self._launch(self._per_call)
        batch = self._ready.popleft()
        out = dict(batch.rows)
        out["indexes"] = batch.indexes
        # (N P_i)^-β / (N P_min)^-β; through logs so extreme ratios stay finite.
        out["weights"] = np.exp(beta * (np.log(batch.min_probability) - np.log(batch.probabilities)))
        return out

    def _discard_prefetched(self) -> None:
        # Nothing of these was handed out, so dropping them biases nothing.
        self._rounds.clear()
        self._ready.clear()

    def _launch(self, batches: int) -> None:
        shards = [s for s in self._shards.values() if s.total > 0.0]
        if not shards:
            if not self._shards:
                raise RuntimeError("sample: no shard left to sample from")
            self._refresh()
            shards = [s for s in self._shards.values() if s.total > 0.0]
            if not shards:
                raise ValueError("sample: the shards hold no transition yet")
        totals = np.array([s.total for s in shards])
        shares = totals / totals.sum()
        counts = np.stack([_split(shares, self._batch_size, self._rng) for _ in range(batches)])
        rnd = _Round(shards, shares, counts)
        for j, shard in enumerate(shards):
            keys, priorities = shard.take_updates()
            rnd.carried.append(0 if keys is None else len(keys))
            rnd.calls.append(shard.link.submit("sample", counts[:, j].tolist(), keys, priorities))
        self._rounds.append(rnd)

    def _refresh(self) -> None:
        """Ask every shard for its mass (when none has any we know of)."""
        for shard in list(self._shards.values()):
            try:
                shard.total, shard.min, shard.stored = (
                    shard.link.call("describe", timeout=self._timeout)[k] for k in ("total", "min", "stored"))
            except ShardUnavailable as exc:
                self._drop(shard, str(exc))

    def _collect(self, rnd: _Round) -> None:
        """Wait for a round's replies and turn complete batches into ready ones; draw the rest again."""
        replies: list[dict[str, Any] | None] = []
        for shard, call, carried in zip(rnd.shards, rnd.calls, rnd.carried):
            try:
                reply = shard.link.wait(call, self._timeout)
            except ShardUnavailable as exc:
                self._lost_updates += carried
                self._drop(shard, str(exc))
                reply = None
            else:
                if shard.id in self._shards:
                    shard.total, shard.min, shard.stored = reply["total"], reply["min"], reply["stored"]
            replies.append(reply)
        if any(r is None for r in replies):
            self._rounds.clear()  # split with a shard that is gone
        redraw = 0
        for b in range(len(rnd.counts)):
            batch = self._assemble(rnd, replies, b)
            if batch is None:
                redraw += 1
            else:
                self._ready.append(batch)
        if redraw:
            self._launch(redraw)
            self._collect(self._rounds.pop())

    def _assemble(self, rnd: _Round, replies: list[dict[str, Any] | None], b: int) -> _Batch | None:
        parts, probabilities, floor = [], [], np.inf
        for j, (shard, reply) in enumerate(zip(rnd.shards, replies)):
            count = rnd.counts[b, j]
            part = None if reply is None else reply["batches"][b]
            if count and (part is None or len(part["keys"]) != count):
                return None  # the shard died or emptied: this batch is drawn again
            if reply is None or not reply["total"] > 0.0:
                continue
            scale = rnd.shares[j] / reply["total"]
            floor = min(floor, scale * reply["min"])
            if count:
                parts.append((shard.id, part))
                probabilities.append(scale * part["leaf"])
        rows = {name: _concat([p[name] for _, p in parts]) for name in parts[0][1] if name not in ("keys", "leaf")}
        indexes = np.concatenate([(np.int64(sid) << _KEY_BITS) | p["keys"] for sid, p in parts])
        p = np.concatenate(probabilities)
        # Leaves can move between a draw and the mass read after it: the
        # smallest probability is at most that of any row drawn.
        return _Batch(rows, indexes, p, min(floor, float(p.min())))

    # -- priorities ----------------------------------------------------------------------------
    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        """Send new priorities of sampled transitions to their shards, without waiting
        (they ride with the shards' next sample calls).

        An update whose slot was overwritten since it was sampled, or whose
        shard is gone, is dropped (see :meth:`stats`).  Bad input raises here,
        queuing nothing: a priority above what its shard's buffer accepts too.
        """
        idx = checks.indexes("indexes", indexes)
        ids = idx >> _KEY_BITS
        bad = np.flatnonzero((idx < 0) | (ids >= self._next_id))
        if bad.size:
            raise ValueError(f"indexes: expected indexes this client's sample() returned, "
                             f"got {idx[bad[0]]} at position {bad[0]}")
        limits = np.full(self._next_id, np.inf)  # a gone shard's updates are dropped: any finite value does
        for sid, shard in self._shards.items():
            limits[sid] = shard.max_priority
        p = checks.priorities("priorities", priorities, len(idx), max_priority=limits[ids])
        for sid in np.unique(ids).tolist():
            mine = ids == sid
            shard = self._shards.get(sid)
            if shard is None:
                self._lost_updates += int(np.count_nonzero(mine))
                continue
            shard.updates.append((idx[mine] & _KEY_MASK, p[mine]))
            if len(shard.updates) >= 2 * self._per_call:  # no sample call came to carry them
                self._send_updates(shard)

    def _send_updates(self, shard: _Shard) -> None:
        keys, priorities = shard.take_updates()
        if keys is None:
            return
        self._updates.append((shard, shard.link.submit("update_priorities", keys, priorities), len(keys)))
        while len(self._updates) > self._max_updates:
            self._settle(*self._updates.popleft())

    def _settle(self, shard: _Shard, pending: Any, count: int) -> None:
        try:
            shard.link.wait(pending, self._timeout)
        except ShardUnavailable as exc:
            self._lost_updates += count
            self._drop(shard, str(exc))

    def flush(self) -> None:
        """Send every priority update not sent yet and wait until all are applied (or dropped)."""
        for shard in list(self._shards.values()):
            self._send_updates(shard)
        while self._updates:
            self._settle(*self._updates.popleft())

    # -- the rest of a buffer's API ------------------------------------------------------------
    def _gather(self, method: str, *args: Any) -> dict[int, Any]:
        pending = [(s, s.link.submit(method, *args)) for s in list(self._shards.values())]
        out = {}
        for shard, call in pending:
            try:
                out[shard.id] = shard.link.wait(call, self._timeout)
            except ShardUnavailable as exc:
                self._drop(shard, str(exc))
        return out

    def get_stored_size(self) -> int:
        """Transitions stored over all shards now."""
        return sum(info["stored"] for info in self._gather("describe").values())

    def get_buffer_size(self) -> int:
        """Capacity over all shards."""
        return sum(s.capacity for s in self._shards.values())

    def get_env_dict(self) -> dict[str, dict[str, Any]]:
        """The shards' field specs."""
        if self._spec is None:
            raise ValueError("get_env_dict: no shard was added yet")
        return dict(self._spec["env_dict"])

    def stats(self) -> dict[str, Any]:
        """Counters summed over the live shards (after waiting for pending updates),
        plus ``shards`` (live), ``shards_lost``, ``updates_to_lost_shards``
        and ``per_shard`` (each live shard's own counters and lock holder, by id)."""
        self.flush()
        per_shard = self._gather("stats")
        out: dict[str, Any] = collections.Counter()
        for counters in per_shard.values():
            out.update({k: v for k, v in counters.items() if k not in _PER_SHARD_ONLY})
        out = dict(out)
        out.update(shards=len(self._shards), shards_lost=self._lost, updates_to_lost_shards=self._lost_updates,
                   per_shard=per_shard)
        return out

    def save_transitions(self, path: str, **kwargs: Any) -> dict[int, Any]:
        """Every shard saves its transitions on its own node to ``path.format(shard=id)``.

        With more than one shard, ``path`` must contain ``{shard}``.
        Returns what each shard's ``save_transitions`` returned, by id.
        """
        if len(self._shards) > 1 and "{shard}" not in path:
            raise ValueError(f"path: expected a '{{shard}}' placeholder to tell the shards' files apart, got {path!r}")
        pending = [(s, s.link.submit("save_transitions", path.format(shard=s.id), **kwargs))
                   for s in self._shards.values()]
        return {s.id: s.link.wait(call, self._timeout) for s, call in pending}


# -- Ray deployment ------------------------------------------------------------------------------
def _ray_server_class() -> Any:
    import ray

    global _RAY_SERVER
    if _RAY_SERVER is None:
        _RAY_SERVER = ray.remote(ShardServer)
    return _RAY_SERVER


_RAY_SERVER: Any = None


def start_shard_servers(buffer: Callable[[], PrioritizedReplayBuffer] | Mapping[str, Any], *,
                        node_ids: Sequence[str] | None = None, name_prefix: str = SHARD_NAME_PREFIX,
                        namespace: str | None = None, **actor_options: Any) -> dict[str, Any]:
    """Start one :class:`ShardServer` Ray actor per node, pinned to it; returns ``{node_id: handle}``.

    Parameters
    ----------
    buffer : callable, or mapping of node id to buffer or callable
        A callable runs inside each server, which then owns its node's buffer
        (typically ``functools.partial(MPPrioritizedReplayBuffer, size, env_dict)``).
        A mapping gives each node its own: a shared buffer made on that node
        (its server attaches), or a callable.
    node_ids : sequence of str, optional
        Where to start servers (default: the mapping's keys, else every live node).
    name_prefix : str
        Each server is a named actor ``name_prefix + node_id``: actors on the
        node find it with :func:`node_buffer`, learners with ``ShardedReplay(discover=name_prefix)``.
    **actor_options
        Passed to Ray's ``.options()`` (``num_cpus``, ``lifetime="detached"``, ...).

    Waits until every server is up, so a failing constructor raises here.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if isinstance(buffer, Mapping):
        per_node = dict(buffer)
        nodes = list(per_node) if node_ids is None else list(node_ids)
        missing = [n for n in nodes if n not in per_node]
        if missing:
            raise ValueError(f"buffer: no buffer given for node(s) {missing}")
    elif callable(buffer):
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]] if node_ids is None else list(node_ids)
        per_node = dict.fromkeys(nodes, buffer)
    else:
        raise TypeError(f"buffer: expected a callable returning a buffer, or a mapping of node id to one, "
                        f"got {type(buffer).__name__}")
    cls = _ray_server_class()
    handles = {
        node: cls.options(name=name_prefix + node, namespace=namespace,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                          **actor_options).remote(per_node[node])
        for node in nodes
    }
    ray.get([h.node_id.remote() for h in handles.values()])
    return handles


def node_buffer(name_prefix: str = SHARD_NAME_PREFIX, namespace: str | None = None) -> PrioritizedReplayBuffer:
    """The buffer of this node's shard server, attached in this process: what a Ray actor writes to."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return ray.get(ray.get_actor(name_prefix + node, namespace=namespace).buffer.remote())


