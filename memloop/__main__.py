"""``python -m memloop``: the same command line as ``memloop``."""

from memloop.experiments.cli import entry

entry()
