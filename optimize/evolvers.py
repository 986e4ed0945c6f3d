"""Evolvers: turn (current memory-write prompts, feedback summary) into new prompts.

- `none`: keeps the prompts (the no-evolution baseline);
- `reflective`: the paper's self-evolution step P' = G(P, F): an LLM rewrites each predictor's
  instructions from the feedback summary (memloop's own prompt; whole instructions are mutable
  because the output format lives in the DSPy signature's fields, not in the text).
GEPA needs candidate evaluations, not just a summary: see optimize/gepa_search.py."""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, Field

from llm.client import ChatClient


class EvolveStep(BaseModel):
    prompts: dict[str, str]
    changes: dict[str, list[str]] = Field(default_factory=dict)   # per predictor
    errors: dict[str, str] = Field(default_factory=dict)          # per predictor, kept old text


class Evolver(Protocol):
    name: str

    def propose(self, prompts: dict[str, str], summary: dict[str, Any], *,
                cycle: int) -> EvolveStep: ...


class NoEvolver:
    name = "none"

    def propose(self, prompts: dict[str, str], summary: dict[str, Any], *,
                cycle: int) -> EvolveStep:
        return EvolveStep(prompts=dict(prompts))


REFLECT_SYSTEM = """You improve the instructions of one step of an AI assistant's long-term memory system. The step decides what the assistant writes into its memory about the user. Better instructions make the assistant remember the facts about the user that later questions depend on, keep them up to date when they change, and drop what no longer holds.

You will see the current instructions and a feedback summary from an evaluation: the user's questions, the memories the assistant had when answering, and (depending on the feedback) its choice, the right choice, the user facts revealed in the conversations and why answers failed. Use the feedback to find which kinds of user information the memory missed, kept stale or stored too vaguely, and rewrite the instructions so that such information is captured precisely next time.

Rules:
- Keep the instructions general: they must help with any user, not only this one. Name kinds of information (e.g. "current living situation", "how often they do X"), never this user's specific values.
- Keep what already works; be concrete about what to record and how to update it.
- Do not describe output formats or JSON: the format is fixed elsewhere.
- Keep it under {max_words} words."""

REFLECT_USER = """Step: {name}

Current instructions:
<instructions>
{instructions}
</instructions>

Feedback summary:
<feedback>
{feedback}
</feedback>

Reply with a JSON object: {{"new_instructions": "<the complete improved instructions>", "changes": ["<short note of each change>", ...]}}"""

REFLECT_SCHEMA = {
    "type": "object",
    "properties": {
        "new_instructions": {"type": "string", "minLength": 40},
        "changes": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["new_instructions", "changes"],
    "additionalProperties": False,
}


class ReflectiveEvolver:
    """One LLM call per predictor (component `optimizer`); a reply that is not valid, empty or
    too long keeps that predictor's old instructions and records why."""

    name = "reflective"

    def __init__(self, client: ChatClient, *, max_words: int = 350, max_feedback_chars: int = 12000,
                 max_tokens: int = 1024):
        self.client = client
        self.max_words = max_words
        self.max_feedback_chars = max_feedback_chars
        self.max_tokens = max_tokens

    def propose(self, prompts: dict[str, str], summary: dict[str, Any], *,
                cycle: int) -> EvolveStep:
        feedback = json.dumps(summary, ensure_ascii=False, indent=1)
        if len(feedback) > self.max_feedback_chars:
            feedback = feedback[: self.max_feedback_chars] + "\n... (truncated)"
        step = EvolveStep(prompts=dict(prompts))
        for name, instructions in sorted(prompts.items()):
            messages = [
                {"role": "system", "content": REFLECT_SYSTEM.format(max_words=self.max_words)},
                {"role": "user", "content": REFLECT_USER.format(
                    name=name, instructions=instructions, feedback=feedback)},
            ]
            result = self.client.chat_json(messages, REFLECT_SCHEMA, component="optimizer",
                                           sample=cycle, max_tokens=self.max_tokens)
            if not result.ok:
                step.errors[name] = result.json_error or "no reply"
                continue
            new = _strip_wrapper(result.parsed["new_instructions"])
            if len(new.split()) > 2 * self.max_words:
                step.errors[name] = f"rewrite too long ({len(new.split())} words); kept the old one"
                continue
            if not new.endswith(_ENDINGS):
                step.errors[name] = f"rewrite looks cut off ({new[-40:]!r}); kept the old one"
                continue
            if " ".join(new.split()) == " ".join(instructions.split()):
                step.errors[name] = "rewrite identical to the current instructions"
                continue
            step.prompts[name] = new
            step.changes[name] = [c.strip() for c in result.parsed["changes"] if c.strip()]
        return step


_ENDINGS = (".", "!", "?", ")", "\"", "'")


def _strip_wrapper(text: str) -> str:
    """The reply without the <instructions> tags small models copy from the request."""
    text = text.strip()
    for tag in ("instructions", "new_instructions"):
        if text.startswith(f"<{tag}>"):
            text = text[len(tag) + 2:]
        if text.endswith(f"</{tag}>"):
            text = text[: -len(tag) - 3]
    return text.strip()


def make_evolver(name: str, client: ChatClient) -> Evolver:
    if name == "none":
        return NoEvolver()
    if name == "reflective":
        return ReflectiveEvolver(client)
    raise ValueError(f"evolver {name!r} is not a summary-driven evolver")
