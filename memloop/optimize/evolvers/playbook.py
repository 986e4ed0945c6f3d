"""The `playbook` evolver: a prompt's sentences plus learned one-sentence rules, one delta a time.

In the incremental style of ACE (agentic context engineering), where whole rewrites collapse: a
small model cannot rewrite a whole prompt (it copies it), but it can write one sentence. Each
predictor's prompt is its core instructions followed by the playbook; nothing is fixed: the
core's sentences are shown as units s1, s2, ... that a delta may rewrite or remove like a rule
(the step's record names the sentence and its old and new text):

    <core instructions>

    Rules learned from feedback:
    [r1] When the user reports a change, replace the old value instead of keeping both.
    [r2] ...

Each cycle:
1. **Revert.** When the last change made the validation objective worse (the run's objective on
   validation users: state accuracy, memory score or memory gain), the prompts go back to those
   before it. This is a selection on validation users, like the run's own choice of cycle.
2. **Counts.** Every rule gets helpful / harmful counts: the cycles it was new in that raised or
   lowered the validation objective. They are shown to the reflector and recorded in the step.
3. **Candidate deltas** per predictor from the reflector (component `optimizer`), as
   schema-constrained JSON: ADD a rule, EDIT a sentence or rule (by id) or REMOVE one, each one
   sentence;
   `candidates` of them, sampled apart when more than one.
4. **Screening by replay** (when the search gives a screen, optimize/replay_score.py): each
   candidate and the current prompt are replayed on the training users' recorded conversations
   (memory writes and state queries only); the best candidate is tested against the current
   prompt by the gate (core/stats.py) on the training users' paired state accuracies. It is
   taken when the gate says `improved`, or (`screen_takes: explore`, the default) as an
   exploration step when it beats the current prompt's state accuracy and the gate does not say
   `degraded`; the step records which, and the gate log holds the decision. With two training
   users no replay can show an improvement (the gate needs 7 users for a choice among 3), so at
   the shipped sizes every change is an exploration step, and only the run's selection on
   validation users (also the gate) decides what the run stands for. Its tokens count in the
   step's.
5. **A deterministic merge**: a rule that repeats one already there (same words, or most of
   them), names a user's own state value, is not one sentence or names an unknown id is dropped
   and recorded; ids are never reused; at most `max_rules` rules.

The input's `history` of (prompts, validation objective) of the finished cycles and its replay
`screen` come from the episode search; without them (check_evolver, the period search) there is
no revert, no count and no screening: the first usable delta. The feedback is the summary fitted
to `feedback_chars` (whole questions left out, never a cut text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memloop.core.leaks import LeakCheck, described
from memloop.llm.client import ChatClient
from memloop.llm.usage import add_costs
from memloop.optimize.contract import EvolveInput, EvolveStep
from memloop.optimize.evolvers.base import SENTENCE_ENDINGS
from memloop.optimize.replay_score import ScreenTakes, screen_takes_field

HEADER = "Rules learned from feedback:"
_RULE = re.compile(r"^\[(r\d+)\] (.+)$", re.M)

CHARS_PER_WORD = 12  # a rule's length bound in the answer's schema, per word it may have


def delta_schema(max_words: int) -> dict:
    """The JSON schema of one delta; its strings are bounded, so a runaway answer ends in JSON."""
    return {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["ADD", "EDIT", "REMOVE"]},
            "id": {"type": "string", "maxLength": 16},
            "rule": {"type": "string", "maxLength": max_words * CHARS_PER_WORD},
        },
        "required": ["op", "id", "rule"],
        "additionalProperties": False,
    }


DELTA_SYSTEM = """\
You improve one step of an AI assistant's long-term memory: the step that decides what it writes \
into its memory about the user. Its instructions are numbered sentences (s1, s2, ...) followed by \
a list of short learned rules (r1, r2, ...); every one of them may be changed. From the feedback \
of an evaluation, propose exactly ONE change:
- ADD: a new rule (id: "new"), one sentence of at most {max_words} words;
- EDIT: rewrite the sentence or rule with the given id, one sentence;
- REMOVE: delete the sentence or rule with the given id (rule: "").
Rules must hold for any user: name kinds of information the user states about themselves, never \
one user's values. Prefer fixing what the feedback shows was missed, kept stale or stored \
vaguely; a sentence that keeps the memory from holding what the questions need is a good one to \
rewrite or remove, and so is a rule counted harmful more often than helpful.
Answer with JSON: {{"op": "ADD" | "EDIT" | "REMOVE", "id": "...", "rule": "..."}}."""

DELTA_USER = """Step: {name}

Instructions (id: sentence):
{core}

Rules now (id, helpful / harmful counts, text):
{rules}

Feedback summary:
<feedback>
{feedback}
</feedback>"""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")


def core_units(core: str) -> list[tuple[str, str, int]]:
    """The core's sentences as editable units: (id s1.., sentence, its line)."""
    units: list[tuple[str, str, int]] = []
    for line_no, line in enumerate(core.splitlines()):
        for sentence in _SENTENCE_END.split(line.strip()):
            if sentence.strip():
                units.append((f"s{len(units) + 1}", sentence.strip(), line_no))
    return units


def render_core(units: Sequence[tuple[str, str, int]]) -> str:
    """The core text of `units`, one line per original line (a line left without units goes)."""
    lines: dict[int, list[str]] = {}
    for _, sentence, line_no in units:
        lines.setdefault(line_no, []).append(sentence)
    return "\n".join(" ".join(lines[k]) for k in sorted(lines))


def split_playbook(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(core, [(id, rule), ...]) of a prompt; a prompt without a playbook is all core."""
    core, sep, rest = text.partition("\n\n" + HEADER)
    if not sep:
        return text, []
    return core, _RULE.findall(rest)


def render_playbook(core: str, rules: Sequence[tuple[str, str]]) -> str:
    if not rules:
        return core
    return core + "\n\n" + HEADER + "\n" + "\n".join(f"[{i}] {r}" for i, r in rules)


def _norm(text: str) -> set[str]:
    return set(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def rule_counts(history: Sequence[tuple[dict[str, str], float | None]]) -> dict[str, list[int]]:
    """{rule id: [helpful, harmful]}: each cycle a rule was new in, by the objective's move."""
    counts: dict[str, list[int]] = {}
    for (before, v0), (after, v1) in zip(history, history[1:], strict=False):
        if v0 is None or v1 is None or v0 == v1:
            continue
        old = {i for text in before.values() for i, _ in split_playbook(text)[1]}
        new = {i for text in after.values() for i, _ in split_playbook(text)[1]} - old
        for rule_id in new:
            counts.setdefault(rule_id, [0, 0])[0 if v1 > v0 else 1] += 1
    return counts


class PlaybookSettings(BaseModel):
    """Settings of the playbook evolver (`settings: {playbook: {...}}`)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "2" is not a number here

    candidates: int = Field(3, ge=1, le=16, description="deltas sampled per predictor and cycle")
    sample_temperature: float = Field(
        0.8, ge=0, le=2, description="temperature of the samples when candidates > 1"
    )
    max_rules: int = Field(8, ge=1, le=100, description="rules a playbook may hold")
    max_words: int = Field(30, ge=3, le=200, description="words per rule")
    max_tokens: int = Field(160, ge=16, description="cap of each reflector reply")
    feedback_chars: int = Field(
        6000, ge=200, description="the feedback summary is fitted to this many characters"
    )
    screen_takes: ScreenTakes = screen_takes_field()


class PlaybookEvolver:
    """Per predictor one reflector call (component `optimizer`) for one delta to its rules."""

    name = "playbook"
    Settings = PlaybookSettings

    def __init__(
        self, client: ChatClient, settings: PlaybookSettings | None = None, **overrides: Any
    ):
        self.client = client
        self.settings = settings or PlaybookSettings(**overrides)

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        prompts, cycle, screen = inputs.prompts, inputs.cycle, inputs.screen
        spent = self.client.usage.mark("optimizer")
        history = list(inputs.history)
        base, notes = dict(prompts), []
        if len(history) >= 2:
            (earlier, v0), (_, v1) = history[-2], history[-1]
            if v0 is not None and v1 is not None and v1 < v0:
                base = dict(earlier)
                notes.append(f"reverted cycle {cycle}'s change: validation {v0:.3f} -> {v1:.3f}")
        counts = rule_counts(history)
        used_ids = {
            int(i[1:])
            for text in [*base.values(), *(t for p, _ in history for t in p.values())]
            for i, _ in split_playbook(text)[1]
        }
        next_id = max(used_ids, default=0) + 1
        fitted = inputs.summary.fit(self.settings.feedback_chars)
        feedback = fitted.render()
        leaks = inputs.leaks
        if fitted is not inputs.summary:
            notes.append(
                f"feedback fitted to {self.settings.feedback_chars} characters: "
                f"{inputs.summary.questions() - fitted.questions()} questions left out"
            )
        step = EvolveStep(prompts=dict(base))
        screened_tokens, screened_cost = 0, None
        for name, text in sorted(base.items()):
            core, rules = split_playbook(text)
            options: list[Any] = []
            problems: list[str] = []
            for delta in self._deltas(name, core, rules, counts, feedback, cycle):
                if isinstance(delta, str):
                    problems.append(delta)
                    continue
                if delta["id"].strip().strip("[]").startswith("s"):
                    new_core, change, problem = self.edit_core(core, delta, leaks, rules)
                    candidate = render_playbook(new_core, rules)
                else:
                    merged, change, problem = self.merge(rules, delta, f"r{next_id}", leaks, core)
                    candidate = render_playbook(core, merged)
                if problem is not None:
                    problems.append(problem)
                elif all(candidate != c for c, _ in options):
                    options.append((candidate, change))
            chosen, note = self._choose(name, base, options, screen, cycle)
            if note[3] is not None:
                step.decisions.append(note[3])
            screened_tokens += note[1]
            screened_cost = add_costs(screened_cost, note[2])
            if chosen is None:
                why = "; ".join(problems) or note[0] or "no usable delta"
                step.errors[name] = f"{why}; kept"
                step.changes[name] = [*notes, *([note[0]] if note[0] else [])]
                continue
            candidate, change = chosen
            if change.startswith("added"):
                next_id += 1
            step.prompts[name] = candidate
            step.changes[name] = [*notes, change, *([note[0]] if note[0] else [])]
        for name in step.prompts:
            listed = [
                f"{i} helpful {counts[i][0]} / harmful {counts[i][1]}"
                for i, _ in split_playbook(base[name])[1]
                if i in counts
            ]
            step.changes.setdefault(name, list(notes))
            if listed:
                step.changes[name].append("counts: " + ", ".join(listed))
        step.tokens = spent.tokens() + screened_tokens
        step.cost_usd = add_costs(spent.cost_usd(), screened_cost)
        return step

    def _deltas(
        self,
        name: str,
        core: str,
        rules: list[tuple[str, str]],
        counts: dict[str, list[int]],
        feedback: str,
        cycle: int,
    ) -> list[dict[str, str] | str]:
        """`candidates` deltas from the reflector (sampled apart when more than one), or why not."""
        shown = "\n".join(
            f"[{i}] helpful {counts.get(i, [0, 0])[0]} / harmful {counts.get(i, [0, 0])[1]}: {r}"
            for i, r in rules
        )
        messages = [
            {"role": "system", "content": DELTA_SYSTEM.format(max_words=self.settings.max_words)},
            {
                "role": "user",
                "content": DELTA_USER.format(
                    name=name,
                    core="\n".join(f"[{i}] {t}" for i, t, _ in core_units(core)) or "(none)",
                    rules=shown or "(none yet)",
                    feedback=feedback,
                ),
            },
        ]
        out: list[dict[str, str] | str] = []
        for j in range(self.settings.candidates):
            result = self.client.chat_json(
                messages,
                delta_schema(self.settings.max_words),
                component="optimizer",
                sample=cycle * 1000 + j,
                max_tokens=self.settings.max_tokens,
                # one candidate: the endpoint's temperature; several: sampled, so they differ
                temperature=None
                if self.settings.candidates == 1
                else self.settings.sample_temperature,
            )
            if result.json_error is not None:
                out.append(f"reflector reply unusable ({result.json_error})")
            else:
                out.append(result.parsed)
        return out

    def _choose(
        self,
        name: str,
        base: dict[str, str],
        options: list[tuple[str, str]],
        screen: Callable[[dict[str, str]], Any] | None,
        cycle: int = 0,
    ) -> tuple[tuple[str, str] | None, tuple[str, int, float | None, dict[str, Any] | None]]:
        """(the option to take or None, (a note, screening tokens, their cost, the gate log entry)).

        Without a screen the first usable option; with one, `replay_score.screen_options`
        (the gate decides, `screen_takes` says whether an exploration step may be taken).
        """
        from memloop.optimize.replay_score import screen_options

        if not options:
            return None, ("", 0, None, None)
        if screen is None:
            return options[0], ("", 0, None, None)
        choice = screen_options(
            name,
            base,
            [c for c, _ in options],
            screen,
            cycle=cycle,
            takes=self.settings.screen_takes,
        )
        taken = None if choice.chosen is None else options[choice.chosen]
        return taken, (choice.note, choice.tokens, choice.cost_usd, choice.decision)

    def edit_core(
        self,
        core: str,
        delta: dict[str, str],
        leaks: LeakCheck,
        rules: list[tuple[str, str]],
    ) -> tuple[str, str, str | None]:
        """(core after `delta` on one of its sentences, what changed, why it was dropped or None).

        Nothing in a prompt is fixed: a starting sentence can be rewritten (EDIT) or removed
        (REMOVE) like a learned rule; ADD always makes a rule. The change names the sentence.
        """
        op, unit_id = delta["op"], delta["id"].strip().strip("[]")
        units = core_units(core)
        found = [u for u in units if u[0] == unit_id]
        if op == "ADD" or not found:
            return core, "", f"{op} of unknown sentence {unit_id!r}"
        old = found[0][1]
        if op == "REMOVE":
            if len(units) == 1:
                return core, "", f"REMOVE of {unit_id} would leave no instruction"
            kept = [u for u in units if u[0] != unit_id]
            return render_core(kept), f"removed {unit_id}: {old}", None
        text = " ".join(delta["rule"].split())
        others = [(i, r) for i, r in rules] + [(i, t) for i, t, _ in units if i != unit_id]
        problem = self._bad_rule(text, others, leaks, core, skip=None)
        if problem:
            return core, "", f"EDIT dropped: {problem}"
        edited = [(i, text if i == unit_id else t, line) for i, t, line in units]
        return render_core(edited), f"rewrote {unit_id}: {old} -> {text}", None

    def merge(
        self,
        rules: list[tuple[str, str]],
        delta: dict[str, str],
        new_id: str,
        leaks: LeakCheck,
        core: str,
    ) -> tuple[list[tuple[str, str]], str, str | None]:
        """(rules after `delta`, what changed, why it was dropped or None)."""
        op, rule_id = delta["op"], delta["id"].strip().strip("[]")
        text = " ".join(delta["rule"].split())
        ids = [i for i, _ in rules]
        if op == "REMOVE":
            if rule_id not in ids:
                return rules, "", f"REMOVE of unknown rule {rule_id!r}"
            return [(i, r) for i, r in rules if i != rule_id], f"removed {rule_id}", None
        problem = self._bad_rule(text, rules, leaks, core, skip=rule_id if op == "EDIT" else None)
        if problem:
            return rules, "", f"{op} dropped: {problem}"
        if op == "EDIT":
            if rule_id not in ids:
                return rules, "", f"EDIT of unknown rule {rule_id!r}"
            edited = [(i, text if i == rule_id else r) for i, r in rules]
            return edited, f"edited {rule_id}: {text}", None
        if len(rules) >= self.settings.max_rules:
            return (
                rules,
                "",
                f"ADD dropped: already {self.settings.max_rules} rules (remove one first)",
            )
        return [*rules, (new_id, text)], f"added {new_id}: {text}", None

    def _bad_rule(
        self,
        text: str,
        rules: list[tuple[str, str]],
        leaks: LeakCheck,
        core: str,
        skip: str | None,
    ) -> str | None:
        words = text.split()
        if not 3 <= len(words) <= self.settings.max_words:
            return f"{len(words)} words (one sentence of 3 to {self.settings.max_words})"
        if not text.endswith(SENTENCE_ENDINGS) or re.search(r"[.!?] +[A-Z]", text):
            return "not one sentence"
        mine = _norm(text)
        for i, r in rules:
            theirs = _norm(r)
            if i != skip and len(mine & theirs) >= 0.8 * max(len(mine), len(theirs)):
                return f"repeats rule {i}"
        hits = leaks.reject(text, core)
        if hits:
            return described(hits)
        return None
