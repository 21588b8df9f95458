"""The replay buffers in one process, without any multiprocessing: Q-learning on CartPole.

Shows a :class:`~mpreplay.PrioritizedReplayBuffer` that folds 3-step returns
itself (``nstep=``), the cpprb-style loop ``add`` / ``on_episode_end`` /
``sample`` / ``update_priorities``, and ``save_transitions`` /
``load_transitions``.  The Q-function is linear in quadratic features of the
observation, in numpy, so gymnasium is the only extra dependency.  It learns
something (returns around 100 after 20k steps, from about 20 at random) but
does not solve CartPole: ``mpreplay demo`` does, with a network and processes::

    python examples/library_use.py --steps 20000
"""

from __future__ import annotations

import argparse
import os
import tempfile

import gymnasium as gym
import numpy as np

from mpreplay import PrioritizedReplayBuffer

ENV_DICT = {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": (4,)}, "done": {}}
NSTEP = {"size": 3, "gamma": 0.99}  # stored rows get a "discount" field: gamma ** (steps folded)


def features(obs: np.ndarray) -> np.ndarray:
    """The observation, its pairwise products and a constant: the Q-function's inputs."""
    products = (obs[..., :, None] * obs[..., None, :]).reshape(obs.shape[:-1] + (16,))
    return np.concatenate([obs, products, np.ones(obs.shape[:-1] + (1,), obs.dtype)], axis=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    rb = PrioritizedReplayBuffer(10_000, ENV_DICT, alpha=0.6, nstep=NSTEP, seed=args.seed)
    weights = np.zeros((2, 21))  # Q(s, a) = weights[a] . features(s)
    obs, _ = env.reset(seed=args.seed)
    returns, episode_return = [], 0.0
    for step in range(args.steps):
        eps = max(0.05, 1.0 - step / 5_000)
        act = int(rng.integers(2)) if rng.random() < eps else int(np.argmax(weights @ features(obs)))
        next_obs, rew, terminated, truncated, _ = env.step(act)
        rb.add(obs=obs, act=act, rew=rew, next_obs=next_obs, done=terminated)
        obs, episode_return = next_obs, episode_return + rew
        if terminated or truncated:
            rb.on_episode_end()  # flush the last steps (they bootstrap unless terminated)
            returns.append(episode_return)
            obs, episode_return = env.reset()[0], 0.0

        if rb.get_stored_size() >= 256:
            batch = rb.sample(64, beta=0.4)
            x, next_x = features(batch["obs"]), features(batch["next_obs"])
            q = np.take_along_axis(x @ weights.T, batch["act"][:, None], axis=1)[:, 0]
            target = batch["rew"] + batch["discount"] * (1.0 - batch["done"]) * (next_x @ weights.T).max(axis=1)
            td = target - q
            # Semi-gradient step on the importance-weighted squared TD error.
            grad = np.zeros_like(weights)
            np.add.at(grad, batch["act"], (batch["weights"] * np.clip(td, -1, 1))[:, None] * x)
            weights += 3e-2 * grad
            rb.update_priorities(batch["indexes"], np.abs(td))

    recent = np.mean(returns[-20:]) if returns else float("nan")
    print(f"{args.steps} steps, {len(returns)} episodes, mean return of the last 20: {recent:.1f}")
    print(f"stored {rb.get_stored_size()} transitions; counters {rb.stats()}")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cartpole.npz")
        rb.save_transitions(path)
        # Loading checks the fields and the n-step settings against the new buffer first.
        copy = PrioritizedReplayBuffer(10_000, ENV_DICT, nstep=NSTEP)
        loaded = copy.load_transitions(path)
        print(f"saved and loaded {loaded} transitions ({os.path.getsize(path) / 1e3:.0f} kB)")
        if loaded != rb.get_stored_size():
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
