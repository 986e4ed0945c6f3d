"""JSON paths for violation messages, e.g. ``[3].periods[2].state.commute_mode``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TYPE_TAG = re.compile(r"^[a-z-]+\[.*\]$")  # pydantic's union/function tags such as 'list[str]'

FILE_PATH = "(file)"
"""Shown in place of a JSON path for problems with the file as a whole."""

ROOT_PATH = "(top level)"
"""Shown in place of an empty JSON path."""


def key(name: str) -> str:
    """One object-key step: ``.name`` for identifier-like keys, ``["odd key"]`` otherwise."""
    return f".{name}" if _PLAIN_KEY.match(name) else f"[{json.dumps(name, ensure_ascii=False)}]"


def join(steps: Iterable[str | int]) -> str:
    """A path from keys and list indexes: ``join([3, 'periods', 2]) == '[3].periods[2]'``."""
    out = "".join(f"[{step}]" if isinstance(step, int) else key(step) for step in steps)
    return out[1:] if out.startswith(".") else out or ROOT_PATH


def from_loc(loc: tuple[str | int, ...], data: Any) -> str:
    """Turn a pydantic error location into a path through `data`.

    Drops pydantic's internal type tags (steps that name no key or index of the input).
    """
    steps: list[str | int] = []
    node = data
    for position, step in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(node, dict) and isinstance(step, str) and step in node:
            steps.append(step)
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            steps.append(step)
            node = node[step]
        elif (
            last and isinstance(node, dict) and isinstance(step, str) and not _TYPE_TAG.match(step)
        ):
            steps.append(step)  # a missing field: the key is absent from the input by definition
        # anything else is a tag pydantic inserted for a union member or validator: skip it
    return join(steps)
