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

from .client import ShardedReplay, ShardLostWarning
from .deploy import SHARD_NAME_PREFIX, node_buffer, start_shard_servers
from .keys import split_indexes
from .server import ShardServer
from .transport import ShardUnavailable

__all__ = [
    "SHARD_NAME_PREFIX",
    "ShardLostWarning",
    "ShardServer",
    "ShardUnavailable",
    "ShardedReplay",
    "node_buffer",
    "split_indexes",
    "start_shard_servers",
]
