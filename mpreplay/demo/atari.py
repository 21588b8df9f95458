"""The Atari task of ``mpreplay demo --env atari``: an ALE game preprocessed as DQN's papers do,
an episode per life, and the frame stacks an actor keeps itself.

* :func:`game`: ``ALE/<game>-v5`` (ale-py, its ROMs included) under gymnasium's
  ``AtariPreprocessing``: 30 no-ops at most on a reset, the action repeated over 4 frames with
  the last two max-pooled, 84x84 grayscale uint8.  Sticky actions stay at v5's 0.25.
* :class:`LifeLoss`: with ``life_loss`` an episode ends (``terminated``) at every lost life, as
  the DQN papers train; the emulator is reset only when the game is over, so the next "episode"
  is the next life of the same game.  ``info["game_over"]`` says which end a step was: the
  returns the demo reports are whole games.  Where the game has a FIRE action, every reset
  presses it once (Breakout waits for it before it serves the ball).
* :class:`FrameStacks`: the last ``depth`` frames of every sub-environment, kept by the actor
  in one array it shifts in place -- never by a wrapper before ``add`` -- and read as the
  replay buffer stores stacks, the stack on the last axis (a strided view, no copy).  The
  buffer (``next_of`` + ``stack_compress``) keeps one frame of each and rebuilds the stacks
  on sample; a new episode's stack repeats its first frame, as the buffer rebuilds it.
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, SupportsFloat

import gymnasium
import numpy as np

from .nature_cnn import FRAME
from .task import Config

__all__ = [
    "DEPTH",
    "AtariConfig",
    "FrameStacks",
    "LifeLoss",
    "game",
    "mean_and_error",
    "num_actions",
    "random_returns",
    "stacked_spaces",
    "vector_env",
]

DEPTH = 4  # frames per stack
_NOOP, _FIRE = 0, 1  # ALE's action numbers (its minimal action sets keep them)


@dataclass(frozen=True)
class AtariConfig(Config):
    """The demo's settings on Atari: sizes count transitions (capacity, learning_starts, actor_batch)."""

    actors: int = 2
    seconds: float = 3600.0
    capacity: int = 250_000
    batch_size: int = 32
    out: str = "./mpreplay-demo-atari"
    lr: float = 2.5e-4
    target_update: int = 500
    publish_every: int = 50
    learning_starts: int = 5_000
    samples_per_insert: float = 2.0
    actor_batch: int = 64
    envs_per_actor: int = 4
    game: str = "Breakout"
    life_loss: bool = True
    dueling: bool = False
    random_games: int = 0
    prefetch: int = 2

    env: ClassVar[str] = "atari"
    solvable: ClassVar[bool] = False
    preload: ClassVar[tuple[str, ...]] = ("gymnasium", "ale_py", "cv2", "mpreplay.demo.apex_atari")

    def __post_init__(self) -> None:
        if self.random_games < 0:
            raise ValueError(f"--random-games: expected an integer >= 0, got {self.random_games}")

    @classmethod
    def arguments(cls, p: argparse.ArgumentParser, d: Config) -> None:
        assert isinstance(d, AtariConfig)
        p.add_argument("--game", default=d.game, help="the ALE game, as in ALE/<game>-v5 (Breakout, Pong, ...)")
        p.add_argument(
            "--life-loss",
            action=argparse.BooleanOptionalAction,
            default=d.life_loss,
            help="end a replay episode at every lost life (the game goes on)",
        )
        p.add_argument("--dueling", action="store_true", help="a dueling head (value + advantages)")
        p.add_argument(
            "--random-games",
            type=int,
            default=d.random_games,
            help="first play this many games with random actions: the baseline in the summary and the plot",
        )

    @property
    def env_id(self) -> str:
        return f"ALE/{self.game}-v5"

    @property
    def title(self) -> str:
        return f"{self.env_id}, returns of whole games" + (", a replay episode per life" if self.life_loss else "")


def _register_ale() -> None:
    import ale_py

    gymnasium.register_envs(ale_py)


class LifeLoss(gymnasium.Wrapper):
    """Every lost life ends an episode (``terminated``) when ``life_loss`` is set; the game goes
    on, and the emulator is reset only once it is over.  ``info["game_over"]`` marks a step that
    ended the game (or cut it short).  Every reset presses FIRE where the game has it (a serve),
    and the next life starts with one step of it (or of a no-op)."""

    def __init__(self, env: Any, life_loss: bool):
        super().__init__(env)
        self._life_loss = life_loss
        self._lives, self._game_over = 0, True
        meanings = env.unwrapped.get_action_meanings()
        self._fire = len(meanings) > _FIRE and meanings[_FIRE] == "FIRE"

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = int(info["lives"])
        lost = self._life_loss and lives < self._lives
        self._lives, self._game_over = lives, bool(terminated or truncated)
        info["game_over"] = self._game_over
        return obs, reward, bool(terminated or lost), bool(truncated), info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
            if not self._fire:
                return self._started(obs, info)
        # The game's first serve, or the next life: press FIRE, or step once with a no-op.
        obs, _, terminated, truncated, info = self.env.step(_FIRE if self._fire else _NOOP)
        if terminated or truncated:  # the game ended on that very step: start a new one
            self._game_over = True
            return self.reset()
        return self._started(obs, info)

    def _started(self, obs: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        self._lives, self._game_over = int(info["lives"]), False
        info["game_over"] = False
        return obs, info


def game(config: AtariConfig) -> Any:
    """One preprocessed game: 84x84 grayscale uint8 frames, 4 frames a step (see the module)."""
    from gymnasium.wrappers import AtariPreprocessing

    _register_ale()

    env = gymnasium.make(config.env_id, frameskip=1)  # AtariPreprocessing skips the frames itself
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=FRAME[0], grayscale_obs=True)
    return LifeLoss(env, config.life_loss)


@functools.cache
def _actions_of(env_id: str) -> int:
    _register_ale()
    env = gymnasium.make(env_id)
    try:
        return int(env.action_space.n)  # type: ignore[attr-defined]
    finally:
        env.close()


def num_actions(config: AtariConfig) -> int:
    """The game's actions (its minimal set, as v5 gives it)."""
    return _actions_of(config.env_id)


def vector_env(config: AtariConfig) -> Any:
    """``config.envs_per_actor`` games stepped in this process (NextStep autoreset)."""
    return gymnasium.vector.SyncVectorEnv([lambda: game(config)] * config.envs_per_actor)


@dataclass(frozen=True)
class _Spaces:
    """What :class:`~mpreplay.vector_env.VectorTransitions` reads of an env, for the stacks an
    actor passes in place of the env's frames."""

    num_envs: int
    single_observation_space: Any
    single_action_space: Any
    metadata: dict[str, Any]


def stacked_spaces(env: Any, with_q: bool = True) -> _Spaces:
    """``env`` (a vector env of :func:`game`) as seen through the actor's stacks: observations
    ``{"frames": (84, 84, DEPTH) uint8, "q": one float32 per action}`` (with ``with_q``; the
    Q-values the actor computed for the stack ride with it through the n-step folder, so a row's
    initial priority needs no second forward pass), or the stacks alone."""
    from gymnasium.spaces import Box, Dict

    frames = Box(0, 255, (*FRAME, DEPTH), np.uint8)
    q = Box(-np.inf, np.inf, (int(env.single_action_space.n),), np.float32)
    space = Dict({"frames": frames, "q": q}) if with_q else frames
    return _Spaces(env.num_envs, space, env.single_action_space, dict(env.metadata))


class FrameStacks:
    """The last :data:`DEPTH` frames of each of ``num_envs`` sub-environments, in one array.

    ``frames`` is ``(num_envs, DEPTH, 84, 84)`` uint8, oldest first (each frame contiguous);
    :attr:`stacks` shows it as the buffer stores stacks, ``(num_envs, 84, 84, DEPTH)``.
    """

    def __init__(self, num_envs: int):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        self.frames = np.zeros((num_envs, DEPTH, *FRAME), np.uint8)

    @property
    def stacks(self) -> np.ndarray:
        """``(num_envs, 84, 84, DEPTH)``: a view, valid until the next :meth:`push`."""
        return np.moveaxis(self.frames, 1, -1)

    def _checked(self, frames: Any) -> np.ndarray:
        arr = np.asarray(frames)
        expected = (len(self.frames), *FRAME)
        if arr.dtype != np.uint8 or arr.shape != expected:
            raise ValueError(f"frames: expected uint8 of shape {expected}, got {arr.dtype} of shape {arr.shape}")
        return arr

    def push(self, frames: Any, restart: Any = None) -> None:
        """Add each sub-environment's newest frame; where ``restart`` (a bool per sub-environment)
        is set, a new episode starts: its stack is the frame repeated.  Checks before it changes
        anything."""
        new = self._checked(frames)
        fresh = np.zeros(len(self.frames), bool) if restart is None else np.asarray(restart)
        if fresh.shape != (len(self.frames),) or fresh.dtype != np.bool_:
            raise ValueError(
                f"restart: expected {len(self.frames)} bools (one per sub-environment), got "
                f"{fresh.dtype} of shape {fresh.shape}"
            )
        go_on = ~fresh
        self.frames[go_on, :-1] = self.frames[go_on, 1:]
        self.frames[go_on, -1] = new[go_on]
        self.frames[fresh] = new[fresh, None]

    def restart(self, frames: Any) -> None:
        """Start every sub-environment's episode at ``frames``."""
        self.push(frames, np.ones(len(self.frames), bool))


def random_returns(config: AtariConfig, games: int, seed: int = 0) -> np.ndarray:
    """The returns of ``games`` whole games played with uniformly random actions, on the same
    preprocessing and life handling as the demo's actors (one environment, this process)."""
    env = game(config)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    try:
        env.reset(seed=seed)
        total = 0.0
        while len(returns) < games:
            _, reward, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
            total += float(reward)
            if info["game_over"]:
                returns.append(total)
                total = 0.0
            if terminated or truncated:
                env.reset()
    finally:
        env.close()
    return np.array(returns)


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """The mean and its standard error (0 for fewer than 2 values)."""
    if not len(values):
        return math.nan, math.nan
    error = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return float(values.mean()), error
