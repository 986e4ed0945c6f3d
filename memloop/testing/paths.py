"""Where the tests find the checkout they test: the repository, its test data, shipped files.

For tests run from a checkout (an editable install): `REPO` is the folder holding memloop/,
tests/, docs/, benchmarks/ and examples/.
"""

from __future__ import annotations

from pathlib import Path

import memloop
from memloop.core.settings import SHIPPED_FILES

PACKAGE = Path(memloop.__file__).resolve().parent
REPO = PACKAGE.parent
TEST_DATA = REPO / "tests" / "data"
SHIPPED = SHIPPED_FILES  # endpoints, policies, environments, experiment files
