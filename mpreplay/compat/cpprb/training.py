"""cpprb's ``train``: a minimal off-policy training loop over a buffer and an environment."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

from ... import checks
from .buffers import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer

__all__ = ["train"]

_SIZE_T_LIMIT = 2**64 - 1  # cpprb counts steps in a size_t


def _default_logger() -> logging.Logger:
    logger = logging.getLogger("mpreplay.compat.cpprb")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _reset(env: Any) -> Any:
    """The first observation: gym's ``reset()`` returns it, gymnasium's ``(obs, info)``."""
    out = env.reset()
    return out[0] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else out


def _step(env: Any, action: Any) -> tuple[Any, Any, Any, Any]:
    """``(next_obs, reward, done, info)`` from gym's 4-tuple or gymnasium's 5-tuple."""
    out = env.step(action)
    if len(out) == 5:
        next_obs, reward, terminated, truncated, info = out
        return next_obs, reward, terminated or truncated, info
    return out


def train(
    buffer: Any,
    env: Any,
    get_action: Callable,
    update_policy: Callable,
    *,
    max_steps: int = int(1e6),
    max_episodes: int | None = None,
    batch_size: int = 64,
    n_warmups: int = 0,
    after_step: Callable | None = None,
    done_check: Callable | None = None,
    obs_update: Callable | None = None,
    rew_sum: Callable[[float, Any], float] | None = None,
    episode_callback: Callable[[int, int, float], Any] | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """Run ``env`` with ``get_action(obs, step, episode, is_warmup)`` for ``max_steps`` steps
    (or ``max_episodes`` episodes), adding each transition to ``buffer`` and, after
    ``n_warmups`` steps, calling ``update_policy(sample, step, episode)`` on a sample of
    ``batch_size``; with a prioritized buffer its return value (``|TD|``) becomes the sampled
    transitions' priorities.  The callbacks are cpprb's: ``after_step(obs, step_result,
    step, episode)`` makes the transition dict, ``done_check(transition)`` ends episodes,
    ``obs_update(transition)`` gives the next observation, ``rew_sum(total, transition)``
    sums episode rewards and ``episode_callback(episode, episode_step, reward)`` is told
    of each episode.  Both gym's and gymnasium's ``reset``/``step`` are understood.
    """
    warnings.warn("cpprb.train is a beta API in cpprb; its signature may change there", stacklevel=2)
    logger = logger or _default_logger()
    if max_steps >= _SIZE_T_LIMIT:
        raise ValueError(f"max_steps: expected fewer than {_SIZE_T_LIMIT}, got {max_steps}")
    max_steps = max(int(max_steps), 0)
    max_episodes = _SIZE_T_LIMIT if max_episodes is None else max(int(max_episodes), 0)
    n_warmups = max(int(n_warmups), 0)
    batch_size = checks.integer("batch_size", batch_size, low=1)
    prioritized = isinstance(buffer, (PrioritizedReplayBuffer, MPPrioritizedReplayBuffer))

    episode = episode_step = 0
    episode_reward = 0.0
    obs = _reset(env)
    start = time.perf_counter()
    for step in range(max_steps):
        is_warmup = step < n_warmups
        action = get_action(obs, step, episode, is_warmup)
        if after_step is not None:
            transition = after_step(obs, action, env.step(action), step, episode)
        else:
            next_obs, reward, done, _ = _step(env, action)
            transition = {"obs": obs, "act": action, "rew": reward, "next_obs": next_obs, "done": done}
        buffer.add(**transition)
        if buffer.get_stored_size() > 0 and not is_warmup:  # an n-step buffer may still be empty
            sample = buffer.sample(batch_size)
            td = update_policy(sample, step, episode)
            if prioritized:
                buffer.update_priorities(sample["indexes"], td)
        episode_reward = rew_sum(episode_reward, transition) if rew_sum is not None else transition["rew"]
        if done_check(transition) if done_check is not None else transition["done"]:
            seconds = max(time.perf_counter() - start, 1e-9)
            # cpprb's own line, in cpprb's own format.
            logger.info(
                f"{episode: 6}th episode: {episode_step + 1: 5} steps ({step + 1: 7} in all), "  # noqa: G004
                f"{float(episode_reward): =+7.2f} reward, {(episode_step + 1) / seconds: =+5.2f} steps/s"
            )
            if episode_callback is not None:
                episode_callback(episode, episode_step, episode_reward)
            obs = _reset(env)
            buffer.on_episode_end()
            episode_reward, episode_step = 0.0, 0
            episode += 1
            if episode >= max_episodes:
                break
            start = time.perf_counter()
        else:
            obs = obs_update(transition) if obs_update is not None else transition["next_obs"]
            episode_step += 1
