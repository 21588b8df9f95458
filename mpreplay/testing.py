"""Helpers for tests, benchmarks and trying things out: not used by the library itself.

:class:`LoopbackRayCluster` starts a Ray cluster of several nodes on this
machine (every socket on 127.0.0.1) to try sharded replay without a cluster.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from . import checks

__all__ = ["LoopbackRayCluster"]


def _reload_ray_auth() -> None:
    # Ray reads RAY_AUTH_MODE and the token once per process: make it read them again.
    try:
        # Both exist in the Rays that authenticate by token; ray's _raylet stub declares neither.
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined, unused-ignore]
    except ImportError:  # a Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


# Ray names its unix sockets <temp_dir>/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store.<n>:
# up to 67 bytes after temp_dir (a pid of 7 digits, a node number of 2), and a socket's path holds at most 107.
_RAY_SOCKET_TAIL = 70
_SOCKET_PATH_MAX = 107
_TEMP_PREFIX = "mpr-ray-"
_DRIVER_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _ray_temp_dir() -> str:
    """A new folder for Ray's session files: under the temporary folder where Ray's socket paths
    fit below it, else under /tmp (a deep ``TMPDIR`` otherwise fails Ray's start with
    "AF_UNIX path length cannot exceed 107 bytes")."""
    roots = [tempfile.gettempdir(), "/tmp"]
    for root in roots:
        longest = len(os.path.join(root, _TEMP_PREFIX + "x" * 8).encode()) + _RAY_SOCKET_TAIL
        if longest <= _SOCKET_PATH_MAX and os.access(root, os.W_OK | os.X_OK):
            return tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=root)
    raise RuntimeError(
        f"LoopbackRayCluster: no folder among {roots} is writable and short enough for Ray's "
        f"socket paths ({_SOCKET_PATH_MAX} bytes); set TMPDIR to a short writable folder"
    )


class LoopbackRayCluster:
    """A Ray cluster of ``nodes`` nodes on this machine, every socket on 127.0.0.1, this process its driver.

    For tests, benchmarks and trying sharded replay out.  Token
    authentication is on with a fresh token kept in the environment (no file
    in the home folder), usage statistics are off, there is no dashboard,
    and Ray's session files (and its "current cluster" address file) go to a
    temporary folder removed on exit (under ``TMPDIR``, or under ``/tmp`` where ``TMPDIR`` is too
    deep for Ray's socket paths)::

        with LoopbackRayCluster(3) as cluster:
            servers = start_shard_servers(make_buffer)   # one per node
            replay = ShardedReplay(servers.values())

    ``system_config`` overrides Ray's internal settings cluster-wide (e.g.
    ``{"max_direct_call_object_size": 64 << 20}``).  Never connects to a
    cluster it finds: refuses to start if Ray is already initialised in this process.
    """

    _ENV: ClassVar[dict[str, str]] = {
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }

    def __init__(
        self,
        nodes: int = 3,
        *,
        cpus_per_node: int = 1,
        object_store_mb: int = 128,
        namespace: str | None = None,
        system_config: Mapping[str, Any] | None = None,
    ):
        nodes = checks.integer("nodes", nodes, low=1)
        self._count, self._namespace = nodes, namespace
        # Notice a removed node within about a second, not half a minute.
        self._system_config = {
            "health_check_initial_delay_ms": 0,
            "health_check_period_ms": 200,
            "health_check_failure_threshold": 5,
            **(system_config or {}),
        }
        self._node_args = {
            "node_ip_address": "127.0.0.1",
            "num_cpus": cpus_per_node,
            "object_store_memory": object_store_mb * 2**20,
        }
        self._nodes: dict[str, Any] = {}
        self._cluster: Any = None
        self._tmp: str | None = None

    def __enter__(self) -> LoopbackRayCluster:
        # Ray reads some of these at import: set them first.
        self._saved_env = {k: os.environ.get(k) for k in (*self._ENV, "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
        # ray.init sets SIGTERM/SIGINT handlers of its own in the driver and leaves them after shutdown:
        # the process gets its own back on exit (a buffer created later then unlinks on SIGTERM).
        self._saved_handlers = (
            {sig: signal.getsignal(sig) for sig in _DRIVER_SIGNALS}
            if threading.current_thread() is threading.main_thread()
            else {}
        )
        os.environ.update(self._ENV)
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        # Where Ray was imported earlier it still resolves "127.0.0.1" to the
        # machine's public address.
        self._saved_cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        _reload_ray_auth()
        if ray.is_initialized():
            self.__exit__()
            raise RuntimeError("LoopbackRayCluster: Ray is already initialised in this process")
        self._tmp = _ray_temp_dir()
        self._node_args["temp_dir"] = self._tmp
        # Ray also keeps the address of "the current cluster" in a folder of its
        # own ($RAY_TMPDIR/ray, by default under $TMPDIR or /tmp), which a fresh
        # machine does not have: point it into ours, so that nothing lands there
        # and a later ray.init() elsewhere does not find this cluster.
        os.environ["RAY_TMPDIR"] = self._tmp
        os.makedirs(os.path.join(self._tmp, "ray"))
        try:
            self._cluster = Cluster(
                initialize_head=True,
                shutdown_at_exit=True,
                head_node_args={**self._node_args, "include_dashboard": False, "_system_config": self._system_config},
            )
            self._nodes[self._cluster.head_node.node_id] = self._cluster.head_node
            for _ in range(self._count - 1):
                self.add_node()
            ray.init(
                address=self._cluster.address,
                _node_ip_address="127.0.0.1",
                namespace=self._namespace,
                log_to_driver=False,
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import ray
        from ray._private import ray_constants

        if self._cluster is not None:
            ray.shutdown()
            self._cluster.shutdown()
            self._cluster = None
        self._nodes.clear()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reload_ray_auth()
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        ray_constants.ENABLE_RAY_CLUSTER = self._saved_cluster_flag
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def address(self) -> str:
        """Address of the head node (for ``ray.init(address=...)`` in another process)."""
        return self._cluster.address

    @property
    def node_ids(self) -> list[str]:
        """Ids of the live nodes, the head (this driver's node) first."""
        return list(self._nodes)

    def add_node(self) -> str:
        """Start one more node; returns its id."""
        node = self._cluster.add_node(**self._node_args)
        self._nodes[node.node_id] = node
        return node.node_id

    def remove_node(self, node_id: str) -> None:
        """Kill every process of a node (not the head): its actors die as on a lost machine."""
        if node_id == self._cluster.head_node.node_id:
            raise ValueError("node_id: the head node runs this driver and cannot be removed")
        self._cluster.remove_node(self._nodes.pop(node_id), allow_graceful=False)
