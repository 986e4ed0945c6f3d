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
- Make at least one concrete change that answers the feedback: a copy of the current instructions is of no use.
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

Answer in exactly this form (plain text, no JSON):
<changes>
- one short line per change you made
</changes>
<new_instructions>
the complete improved instructions
</new_instructions>"""

_BLOCK = r"<{tag}>\s*(.*?)\s*</{tag}>"


def parse_reflection(text: str) -> tuple[str | None, list[str], str | None]:
    """(new instructions, changes, error) from a reply in the tagged plain-text form. Plain text
    instead of JSON: small models copying instructions that contain quotes break JSON strings."""
    import re

    body = re.search(_BLOCK.format(tag="new_instructions"), text, re.S)
    if body is None:
        cut = "<new_instructions>" in text
        return None, [], ("rewrite cut off (no closing tag)" if cut
                          else "no <new_instructions> block in the reply")
    changes_block = re.search(_BLOCK.format(tag="changes"), text, re.S)
    changes = [line.strip().lstrip("-*").strip()
               for line in (changes_block.group(1).splitlines() if changes_block else [])]
    return body.group(1).strip(), [c for c in changes if c], None


class ReflectiveEvolver:
    """One LLM call per predictor (component `optimizer`); a reply that is malformed, cut off,
    too short or too long, or identical to the current text keeps that predictor's old
    instructions and records why."""

    name = "reflective"

    def __init__(self, client: ChatClient, *, max_words: int = 350, max_feedback_chars: int = 12000,
                 max_tokens: int = 1024, retry_temperature: float | None = 0.8):
        self.client = client
        self.retry_temperature = retry_temperature
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
            # the endpoint's temperature first; a rejected rewrite is asked once more with
            # sampling (small models at temperature 0 tend to copy the instructions verbatim)
            attempts = [(cycle, None)]
            if self.retry_temperature is not None:
                attempts.append((cycle + 1000, self.retry_temperature))
            problems = []
            for sample, temperature in attempts:
                reply = self.client.chat(messages, component="optimizer", sample=sample,
                                         temperature=temperature, max_tokens=self.max_tokens)
                new, changes, problem = self._check(reply.text, instructions)
                if problem is None:
                    step.prompts[name] = new
                    step.changes[name] = changes
                    break
                problems.append(problem)
            else:
                step.errors[name] = "; ".join(problems) + "; kept the old one"
        return step

    def _check(self, text: str, instructions: str) -> tuple[str, list[str], str | None]:
        """(new instructions, changes, why they are rejected or None)."""
        parsed, changes, error = parse_reflection(text)
        if error:
            return "", [], error
        new = _strip_wrapper(parsed or "")
        words = len(new.split())
        if words < 8:
            return new, changes, f"rewrite too short ({words} words)"
        if words > 2 * self.max_words:
            return new, changes, f"rewrite too long ({words} words)"
        if not new.endswith(_ENDINGS):
            return new, changes, f"rewrite looks cut off ({new[-40:]!r})"
        if " ".join(new.split()) == " ".join(instructions.split()):
            return new, changes, "rewrite identical to the current instructions"
        return new, changes, None


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
