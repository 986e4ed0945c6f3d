"""The `reflective` evolver: the paper's self-evolution step P' = G(P, F).

An LLM rewrites each predictor's instructions from the feedback summary (memloop's own prompt;
whole instructions are mutable because the output format lives in the DSPy signature's fields,
not in the text). When the rewrite is rejected (small models mostly copy the instructions
verbatim), the same model is asked for the easier edit: one to three new rules, appended to the
current instructions.
GEPA needs candidate evaluations, not just a summary: it is a search (optimize/searches/gepa.py).
An evolver reports the tokens each proposal used in `EvolveStep.tokens`. The contract they
implement is in optimize/contract.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memloop.core.leaks import LeakCheck, described
from memloop.llm.client import ChatClient
from memloop.optimize.contract import EvolveInput, EvolveStep
from memloop.optimize.evolvers.base import SENTENCE_ENDINGS, strip_wrapper

REFLECT_SYSTEM = """\
You improve the instructions of one step of an AI assistant's long-term memory system. The step \
decides what the assistant writes into its memory about the user. Better instructions make the \
assistant remember the facts about the user that later questions depend on, keep them up to date \
when they change, and drop what no longer holds.

You will see the current instructions and a feedback summary from an evaluation: the user's \
questions, the memories the assistant had when answering, and (depending on the feedback) its \
choice, the right choice, the user facts revealed in the conversations and why answers failed. Use \
the feedback to find which kinds of user information the memory missed, kept stale or stored too \
vaguely, and rewrite the instructions so that such information is captured precisely next time.

Rules:
- Keep the instructions general: they must help with any user, not only this one. Name kinds of \
information the user states about themselves, never this user's specific values.
- Keep what already works; be concrete about what to record and how to update it.
- Make at least one concrete change that answers the feedback: a copy of the current instructions \
is of no use.
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

RULES_SYSTEM = """\
You improve the instructions of one step of an AI assistant's long-term memory system. The step \
decides what the assistant writes into its memory about the user.

You will see the current instructions and a feedback summary from an evaluation: the user's \
questions, the memories the assistant had when answering, and (depending on the feedback) its \
choice, the right choice, the user facts revealed in the conversations and why answers failed.

Write one to three NEW rules to add to the instructions, each a single sentence, so that next time \
the memory captures the kinds of user information the feedback shows it missed, kept stale or \
stored too vaguely.

Rules:
- General rules about kinds of information the user states about themselves, never this user's \
specific values.
- Do not repeat a rule the instructions already have.
- Do not describe output formats or JSON."""

RULES_USER = """Step: {name}

Current instructions:
<instructions>
{instructions}
</instructions>

Feedback summary:
<feedback>
{feedback}
</feedback>

Answer in exactly this form (plain text):
<rules>
- first new rule
</rules>"""

_BLOCK = r"<{tag}>\s*(.*?)\s*</{tag}>"


def parse_reflection(text: str) -> tuple[str | None, list[str], str | None]:
    """Parse a reply in the tagged plain-text form into (new instructions, changes, error).

    Plain text instead of JSON: small models copying instructions that contain quotes break JSON
    strings.
    """
    import re

    body = re.search(_BLOCK.format(tag="new_instructions"), text, re.S)
    if body is None:
        cut = "<new_instructions>" in text
        return (
            None,
            [],
            (
                "rewrite cut off (no closing tag)"
                if cut
                else "no <new_instructions> block in the reply"
            ),
        )
    changes_block = re.search(_BLOCK.format(tag="changes"), text, re.S)
    changes = [
        line.strip().lstrip("-*").strip()
        for line in (changes_block.group(1).splitlines() if changes_block else [])
    ]
    return body.group(1).strip(), [c for c in changes if c], None


def parse_rules(
    text: str,
    instructions: str,
    *,
    max_rules: int = 3,
    max_words: int = 60,
    leaks: LeakCheck | None = None,
) -> tuple[list[str], str | None]:
    """Parse a reply in the <rules> form into (new rules, error).

    One sentence per line, at most `max_rules`; rules the instructions already contain, fragments,
    run-ons and rules the `leaks` check rejects (naming a user's private value) are dropped.
    """
    import re

    bullet = r"^\s*(?:[-*\u2022]|\d+[.)])\s+"
    block = re.search(_BLOCK.format(tag="rules"), text, re.S)
    if block is not None:
        lines = block.group(1).splitlines()
    else:
        # small models often drop the tags (or the closing one): keep the bullet lines only
        lines = [ln for ln in text.split("<rules>")[-1].splitlines() if re.match(bullet, ln)]
        if not lines:
            return [], "no <rules> block or bullet lines in the reply"
    known = " ".join(instructions.lower().split())
    rules: list[str] = []
    leaked = 0
    for line in lines:
        rule = re.sub(bullet, "", line).strip()
        words = len(rule.split())
        if not 3 <= words <= max_words or not rule.endswith(SENTENCE_ENDINGS):
            continue
        norm = " ".join(rule.lower().split())
        if norm in known or norm in (" ".join(r.lower().split()) for r in rules):
            continue
        if leaks is not None and leaks.reject(rule, instructions):
            leaked += 1
            continue
        rules.append(rule)
    if not rules:
        why = f" ({leaked} named a user's private value)" if leaked else ""
        return [], "no usable new rule in the reply" + why
    return rules[:max_rules], None


class ReflectiveSettings(BaseModel):
    """Settings of the reflective evolver (`settings: {reflective: {...}}`)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "2" is not a number here

    max_words: int = Field(350, ge=8, description="words a rewrite may have (twice that at most)")
    max_tokens: int = Field(1024, ge=16, description="cap of each reflection reply")
    append_rules: bool = Field(
        True, strict=True, description="when a rewrite is rejected, ask for rules to append"
    )


class ReflectiveEvolver:
    """Per predictor (component `optimizer`): one LLM call for a rewrite, else appended rules.

    A reply that is malformed, cut off, too short or too long, or identical to the current text is
    rejected, and the model is asked once for one to three rules to append instead
    (`append_rules`). When both fail the predictor keeps its old instructions and the reasons are
    recorded.
    """

    name = "reflective"
    confirms = "last"  # it never reads validation scores: the last cycle is its candidate
    Settings = ReflectiveSettings

    def __init__(
        self, client: ChatClient, settings: ReflectiveSettings | None = None, **overrides: Any
    ):
        self.client = client
        self.settings = settings or ReflectiveSettings(**overrides)

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        # the summary arrives within its budget (feedback.summary.budgeted_summary): no cut here
        feedback = inputs.summary.render()
        spent = self.client.usage.mark("optimizer")
        step = EvolveStep(prompts=dict(inputs.prompts))
        leaks = inputs.leaks
        max_words, cycle = self.settings.max_words, inputs.cycle
        for name, instructions in sorted(inputs.prompts.items()):
            request = dict(name=name, instructions=instructions, feedback=feedback)
            reply = self._ask(
                REFLECT_SYSTEM.format(max_words=max_words),
                REFLECT_USER.format(**request),
                cycle,
            )
            new, changes, problem = self._check(reply, instructions, leaks)
            if problem is None:
                step.prompts[name], step.changes[name] = new, changes
                continue
            if self.settings.append_rules:
                # a distinct sample index: the rules request never shares a cache entry
                reply = self._ask(RULES_SYSTEM, RULES_USER.format(**request), cycle + 1000)
                rules, rules_problem = parse_rules(reply, instructions, leaks=leaks)
                new = instructions.rstrip() + "\n" + "\n".join(f"- {r}" for r in rules)
                if rules_problem is None and len(new.split()) <= 2 * max_words:
                    step.prompts[name] = new
                    step.changes[name] = [f"rewrite rejected ({problem}); appended rules"] + [
                        f"added: {r}" for r in rules
                    ]
                    continue
                problem += "; " + (rules_problem or "instructions with the rules too long")
            step.errors[name] = problem + "; kept the old one"
        step.tokens, step.cost_usd = spent.tokens(), spent.cost_usd()
        return step

    def _ask(self, system: str, user: str, sample: int) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.client.chat(
            messages, component="optimizer", sample=sample, max_tokens=self.settings.max_tokens
        ).text

    def _check(
        self, text: str, instructions: str, leaks: LeakCheck | None = None
    ) -> tuple[str, list[str], str | None]:
        """(new instructions, changes, why they are rejected or None)."""
        parsed, changes, error = parse_reflection(text)
        if error:
            return "", [], error
        new = strip_wrapper(parsed or "")
        words = len(new.split())
        if words < 8:
            return new, changes, f"rewrite too short ({words} words)"
        if words > 2 * self.settings.max_words:
            return new, changes, f"rewrite too long ({words} words)"
        if not new.endswith(SENTENCE_ENDINGS):
            return new, changes, f"rewrite looks cut off ({new[-40:]!r})"
        if " ".join(new.split()) == " ".join(instructions.split()):
            return new, changes, "rewrite identical to the current instructions"
        hits = leaks.reject(new, instructions) if leaks is not None else 0
        if hits:
            return new, changes, f"rewrite {described(hits)}"
        return new, changes, None
