"""memloop: evaluate and self-evolve the memory policies of LLM assistants (AMemGym-style).

Import the layer you need, e.g. ``from memloop.optimize import ...``; the command line is
``memloop`` or ``python -m memloop``.
"""

__version__ = "0.1.0"
