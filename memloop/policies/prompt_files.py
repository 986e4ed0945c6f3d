"""Memory-write prompts in the files people keep them in: one reader and writer per format.

- text: ``#`` lines (where the prompts came from), then each prompt under a ``=== name ===`` line;
- mem0: a JSON ``MemoryConfig``-shaped mapping with ``custom_fact_extraction_prompt`` and
  ``custom_update_memory_prompt`` (AWE's ``fact_extraction`` and ``memory_update``);
- dspy: a program's state saved by DSPy's ``save`` (``{predictor: {signature: {instructions}}}``).

`memloop export` writes these (results/export.py); a policy YAML's ``prompts_from:`` reads them
(runs/inputs.py), so an exported prompt starts an `eval` on new users or models, or an evolve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import read_user_text

# AWE's predictor names -> mem0's config keys
MEM0_KEYS = {
    "fact_extraction": "custom_fact_extraction_prompt",
    "memory_update": "custom_update_memory_prompt",
}
_SECTION = re.compile(r"^=== (\S+) ===$")


def render_text(prompts: dict[str, str], header: Iterable[str] = ()) -> str:
    """The text format: `header` lines (each starting with ``#``), then one section per prompt."""
    lines = list(header)
    for line in lines:
        if not line.startswith("#"):
            raise ValueError(f"header lines start with '#': {line!r}")
    for name, prompt in prompts.items():
        lines += ["", f"=== {name} ===", prompt.rstrip("\n")]
    return "\n".join(lines) + "\n"


def parse_text(text: str, where: str) -> dict[str, str]:
    """The prompts of a text-format file; ``#`` lines before the first section are its header."""
    prompts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _SECTION.match(line)
        if match:
            name = match.group(1)
            if name in prompts:
                raise UserError(f"{where}: line {number}: prompt {name!r} given twice")
            current = prompts[name] = []
        elif current is not None:
            current.append(line)
        elif line.strip() and not line.startswith("#"):
            raise UserError(
                f"{where}: line {number}: text before the first '=== name ===' line "
                "(a prompt file has '#' lines, then each prompt under '=== name ===')"
            )
    if not prompts:
        raise UserError(f"{where}: no '=== name ===' section; not a prompt file")
    out = {}
    for name, body in prompts.items():
        while body and body[-1] == "":  # render_text's blank line before the next section
            body = body[:-1]
        out[name] = "\n".join(body)
    return out


def parse_mem0(data: dict[str, Any], where: str) -> dict[str, str]:
    """AWE's prompts from a mem0 config mapping (either key may be absent, not both)."""
    out = {}
    for name, key in MEM0_KEYS.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where}: key {key!r}: expected non-empty text")
        out[name] = value
    if not out:
        keys = " or ".join(repr(k) for k in MEM0_KEYS.values())
        raise UserError(f"{where}: a mem0 config with neither {keys}")
    return out


def parse_dspy(data: dict[str, Any], where: str) -> dict[str, str]:
    """The instructions of each predictor in a DSPy program's saved state."""
    out = {}
    for name, state in data.items():
        if name == "metadata":
            continue
        signature = state.get("signature") if isinstance(state, dict) else None
        text = signature.get("instructions") if isinstance(signature, dict) else None
        if not isinstance(text, str):
            raise UserError(f"{where}: entry {name!r} has no signature.instructions text")
        out[name] = text
    if not out:
        raise UserError(f"{where}: a DSPy program state with no predictor")
    return out


def read_prompt_file(path: Path) -> dict[str, str]:
    """The prompts of a text, mem0 or DSPy file (`memloop export`'s formats), by content."""
    text = read_user_text(path)
    if not text.lstrip().startswith("{"):
        return parse_text(text, str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    if any(key in data for key in MEM0_KEYS.values()):
        return parse_mem0(data, str(path))
    return parse_dspy(data, str(path))
