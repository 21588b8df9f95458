"""``mpreplay demo``: agents that learn from one shared replay buffer, actors and a learner in processes.

* :mod:`~mpreplay.demo.apex`: Ape-X DQN over a prioritized transition buffer (the default), on
  CartPole or, with ``--env atari``, on an Atari game's pixels (:mod:`~mpreplay.demo.apex_atari`);
* :mod:`~mpreplay.demo.r2d2`: R2D2 over a prioritized sequence buffer, the velocities hidden;
* :mod:`~mpreplay.demo.task`: CartPole, the exploration ladder and the rule that says "solved";
* :mod:`~mpreplay.demo.atari`: the Atari task (an ALE game preprocessed, an episode per life, the
  actor's frame stacks) and :mod:`~mpreplay.demo.nature_cnn`, its network;
* :mod:`~mpreplay.demo.processes`: the learner loop and the adds both agents share, and
  :class:`~mpreplay.demo.processes.Agent`, what an agent brings (a new agent is a module with one,
  registered in :data:`~mpreplay.demo.cli.AGENTS`);
* :mod:`~mpreplay.demo.report`: the live view, the summary and the learning curve;
* :mod:`~mpreplay.demo.cli`: the command line and the run.
"""

from __future__ import annotations

from .cli import main
from .processes import Agent
from .task import Config, epsilon, hide_velocity, solve_point

__all__ = ["Agent", "Config", "epsilon", "hide_velocity", "main", "solve_point"]
