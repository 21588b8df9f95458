"""Shard servers as Ray actors, one pinned to each node, found by name."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..table import Table
from .server import ShardServer

__all__ = ["SHARD_NAME_PREFIX", "node_buffer", "start_shard_servers"]

SHARD_NAME_PREFIX = "mpreplay-shard-"  # start_shard_servers names each server this + its node id


@functools.cache
def _ray_server_class() -> Any:
    """ShardServer as a Ray actor class, made once (and only once Ray is needed)."""
    import ray

    return ray.remote(ShardServer)


def start_shard_servers(
    buffer: Callable[[], Table] | Mapping[str, Any],
    *,
    node_ids: Sequence[str] | None = None,
    name_prefix: str = SHARD_NAME_PREFIX,
    namespace: str | None = None,
    **actor_options: Any,
) -> dict[str, Any]:
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
        raise TypeError(
            f"buffer: expected a callable returning a buffer, or a mapping of node id to one, "
            f"got {type(buffer).__name__}"
        )
    cls = _ray_server_class()
    handles = {
        node: cls.options(
            name=name_prefix + node,
            namespace=namespace,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            **actor_options,
        ).remote(per_node[node])
        for node in nodes
    }
    ray.get([h.node_id.remote() for h in handles.values()])
    return handles


def node_buffer(name_prefix: str = SHARD_NAME_PREFIX, namespace: str | None = None) -> Table:
    """The buffer of this node's shard server, attached in this process: what a Ray actor writes to."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return ray.get(ray.get_actor(name_prefix + node, namespace=namespace).buffer.remote())
