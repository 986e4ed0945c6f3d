"""Evolvers by name (`evolvers:` in an evolve YAML): none, reflective, playbook."""

from __future__ import annotations

from memloop.llm.client import ChatClient
from memloop.optimize.evolvers import Evolver, NoEvolver, ReflectiveEvolver


def make_evolver(name: str, client: ChatClient) -> Evolver:
    if name == "none":
        return NoEvolver()
    if name == "reflective":
        return ReflectiveEvolver(client)
    if name == "playbook":
        from memloop.optimize.playbook import PlaybookEvolver

        return PlaybookEvolver(client)
    raise ValueError(f"evolver {name!r} is not a summary-driven evolver")
