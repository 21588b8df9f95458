"""How a client calls a shard server: in-process, or a Ray actor; both answer ``submit`` then ``wait``."""

from __future__ import annotations

from typing import Any

from ..errors import BufferClosed
from .server import ShardServer

__all__ = ["Done", "LocalLink", "RayLink", "ShardUnavailable", "link"]


class ShardUnavailable(RuntimeError):
    """A shard server cannot be reached (its process or node is gone, or it did not answer in time)."""


class Done:
    """A local call, already made: its value or its exception."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error


class LocalLink:
    """Calls an in-process server directly; a closed buffer means the shard is gone."""

    def __init__(self, server: ShardServer):
        self.server = server
        self.key: Any = id(server)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Done:
        try:
            return Done(getattr(self.server, method)(*args, **kwargs))
        except BufferClosed as exc:
            return Done(error=ShardUnavailable(str(exc)))

    def wait(self, pending: Done, timeout: float | None) -> Any:
        if pending.error is not None:
            raise pending.error
        return pending.value

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.wait(self.submit(method, *args), timeout)


class RayLink(LocalLink):
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


def link(shard: Any) -> LocalLink:
    """The link to ``shard``: an in-process :class:`ShardServer`, or a Ray actor handle of one."""
    if isinstance(shard, ShardServer):
        return LocalLink(shard)
    try:
        from ray.actor import ActorHandle
    except ImportError:
        pass  # without Ray nothing is a handle
    else:
        if isinstance(shard, ActorHandle):
            return RayLink(shard)
    raise TypeError(f"shard: expected a ShardServer or a Ray actor handle of one, got {type(shard).__name__}")
