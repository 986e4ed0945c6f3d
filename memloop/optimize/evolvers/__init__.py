"""The evolvers: each turns (current memory-write prompts, feedback) into the next prompts.

One module per evolver; base.py states the order the run calls an evolver in. The names a
plug-in or an older script may import are re-exported here.
"""

from memloop.optimize.evolvers.none import NoEvolver
from memloop.optimize.evolvers.reflective import (
    REFLECT_SYSTEM,
    RULES_SYSTEM,
    ReflectiveEvolver,
    ReflectiveSettings,
    parse_reflection,
    parse_rules,
)

__all__ = [
    "REFLECT_SYSTEM",
    "RULES_SYSTEM",
    "NoEvolver",
    "ReflectiveEvolver",
    "ReflectiveSettings",
    "parse_reflection",
    "parse_rules",
]
