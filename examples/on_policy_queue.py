"""An on-policy trajectory queue: actors push CartPole chunks, a learner consumes each exactly once.

Each actor runs a random policy and pushes chunks of ``--chunk`` steps (one item: a chunk's
observations, actions and rewards).  The buffer is a ``Queue(size)``: an actor waits while
``size`` chunks are unread instead of overwriting one, and the learner takes the oldest
chunks first, each once (as PPO or IMPALA want their rollouts).

    python examples/on_policy_queue.py --actors 3 --updates 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp

import gymnasium as gym
import numpy as np

from mpreplay import MPReplayBuffer, Queue


def actor(buffer: MPReplayBuffer, actor_id: int, chunks: int, chunk: int) -> None:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(actor_id)
    obs, _ = env.reset(seed=actor_id)
    for number in range(chunks):
        observations, actions, rewards = np.zeros((chunk, 4)), np.zeros(chunk, np.int64), np.zeros(chunk)
        for t in range(chunk):
            action = int(rng.integers(2))
            observations[t], actions[t] = obs, action
            obs, rewards[t], terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
        buffer.add(
            actor=actor_id, number=number, obs=observations[None], act=actions[None], rew=rewards[None], timeout=60
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=32, help="steps per trajectory chunk")
    parser.add_argument("--size", type=int, default=8, help="unread chunks the queue holds")
    parser.add_argument("--batch", type=int, default=4, help="chunks per learner update")
    parser.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    chunks_per_actor = -(-args.updates * args.batch // args.actors)  # enough for every update
    env_dict = {
        "actor": {"dtype": np.int64},
        "number": {"dtype": np.int64},
        "obs": {"shape": (args.chunk, 4)},
        "act": {"shape": (args.chunk,), "dtype": np.int64},
        "rew": {"shape": (args.chunk,)},
    }
    with MPReplayBuffer(args.size, env_dict, rate_limiter=Queue(args.size)) as buffer:
        ctx = mp.get_context("spawn")
        actors = [ctx.Process(target=actor, args=(buffer, i, chunks_per_actor, args.chunk)) for i in range(args.actors)]
        for p in actors:
            p.start()
        consumed = set()
        for update in range(args.updates):
            batch = buffer.sample(args.batch, timeout=60)  # waits for `batch` unread chunks
            ids = list(zip(batch["actor"].tolist(), batch["number"].tolist(), strict=True))
            assert consumed.isdisjoint(ids), "a chunk was handed out twice"
            consumed.update(ids)
            print(f"update {update}: chunks (actor, number) {ids}, mean reward {batch['rew'].mean():.2f}")
        while len(consumed) < args.actors * chunks_per_actor:  # the rest, so the actors finish
            batch = buffer.sample(1, timeout=60)
            consumed.add((int(batch["actor"][0]), int(batch["number"][0])))
        for p in actors:
            p.join()
        print(f"consumed {len(consumed)} chunks, each exactly once")


if __name__ == "__main__":
    main()
