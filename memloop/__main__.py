"""``python -m memloop``: the same command line as ``memloop``."""

import sys

from memloop.experiments.cli import main

sys.exit(main())
