"""`gate_passes`: the gate's verdict forced, for tests of what follows a selection.

Tests of compare's pairing, export or plots need a run whose selected cycle is an evolved one;
scripted fakes rarely make one better on every validation user. Inside `gate_passes()` the
gate (core/stats.py) computes its numbers as always but every decision says `improved`. The
gate itself is tested on its own (tests/core/test_core_gate.py); never use this to test a verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from memloop.core import stats


@contextmanager
def gate_passes() -> Iterator[None]:
    """Every `stats.gate_of` decision made inside says `improved` (its numbers unchanged)."""
    real = stats.gate_of

    def passes(candidate: dict[str, float], baseline: dict[str, float], **options: Any):
        return dataclasses.replace(
            real(candidate, baseline, **options), verdict=stats.Verdict.IMPROVED
        )

    with mock.patch.object(stats, "gate_of", passes):
        yield
