"""The `edits` evolver: a proposer that needs no capable model. It chooses edits, it does not write.

A small optimizer model cannot rewrite a prompt (it copies it, or its own examples); it can be
trusted to choose. Each step, per predictor:

1. **Named failures.** The feedback's state reads (feedback/write_failures.py: never written,
   update lost, overwritten (label collision), assistant's words stored, misread), counted.
2. **Edit operators**, each one sentence written here once, generic (no fact kind, no value),
   and each addressing named failures: store the user's own words as the value, or switch the
   value style to a short normalized value; one edit per fact under its own label; an update
   under the label that holds the old value; values from the user's messages only; an edit
   for every fact. Removing one sentence of the prompt is an operator too: nothing in the
   prompt is fixed; a sentence that restricts what is written ("do not", "only", "never", "one
   label") is tried first when facts go unwritten. With `slot: true` the optimizer model fills
   one short slot ("Pay special attention to: ..."), a list of kinds of information, nothing
   else.
   With `max_examples` above 0, adding one worked example (optimize/evolvers/examples.py:
   generated for the purpose, exact edits, no environment's kind or value) or dropping the
   examples block is an edit too; the operators act on the instructions and keep the block, in
   the value style the instructions ask for.
3. **Ranking.** Operators are ranked by the wrong pairs of the failures they address (ties: the
   order above); the first `candidates` not refused before become candidates.
4. **A validator** refuses a candidate that is truncated, over-long, JSON-shaped or copies the
   request (8 words in a row of the feedback), and a leak check one that names a user's value.
5. **Screening** by replay on the training users (optimize/replay_score.py `screen_options`):
   the best candidate against the current prompt, decided by the gate (core/stats.py), an
   exploration step only when `screen_takes: explore`. With more candidates than
   `screen_budget`, successive halving: all on half the training users, the best go on to all.
6. **Tabu.** Every refused edit (by the validator, the leak check, the screen or the gate) is
   recorded with its reason in the step (`EvolveStep.rejected`); later steps read them
   (`EvolveInput.rejected`) and never propose the same edit of the same prompt again.

The step's changes name the operator, the failures it addressed and what happened to every
sentence (kept, added, removed, replaced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memloop.core.files import json_sha256
from memloop.core.leaks import described
from memloop.core.tables import format_number
from memloop.feedback import write_failures as wf
from memloop.llm.client import ChatClient
from memloop.llm.usage import add_costs
from memloop.optimize.contract import EvolveInput, EvolveStep
from memloop.optimize.evolvers.base import SENTENCE_ENDINGS
from memloop.optimize.evolvers.examples import (
    MAX_EXAMPLES,
    NORMALIZED_PHRASE,
    split_examples,
    with_examples,
)
from memloop.optimize.evolvers.playbook import core_units, render_core
from memloop.optimize.replay_score import ScreenTakes, screen_takes_field
from memloop.policies.config import SETTINGS_KEY, parse_settings, settings_text

# a sentence that limits what is written: a prohibition, or a cap on the labels (the evidence
# run's seed "Write one label, topic, ..." was never screened for removal before this)
RESTRICTIVE = re.compile(
    r"\b(do not|don't|never|only|no more than|not record|ignore|one label|a single)\b", re.I
)


@dataclass(frozen=True)
class Operator:
    """One edit: a sentence to add (and the operators whose sentence it replaces)."""

    key: str
    addresses: tuple[str, ...]  # the named failures (feedback/write_failures.py) it answers
    sentence: str
    replaces: tuple[str, ...] = ()


OPERATORS: tuple[Operator, ...] = (
    Operator(
        "own_words",
        (wf.ASSISTANT_WORDS, wf.NEVER_WRITTEN, wf.UPDATE_LOST),
        "As each value, write the user's own sentence that states the fact, copied from the "
        "user's message.",
        replaces=("normalized",),
    ),
    Operator(
        "every_fact",
        (wf.NEVER_WRITTEN,),
        "Write one edit for every fact the user states about their own life, however small.",
    ),
    Operator(
        "same_label_update",
        (wf.UPDATE_LOST,),
        "When the user says something changed, write the new situation under the label that "
        "holds the old one.",
    ),
    Operator(
        "one_per_fact",
        (wf.COLLISION,),
        "Give each distinct fact a label of its own; never put two different facts under one "
        "label.",
    ),
    Operator(
        "user_only",
        (wf.ASSISTANT_WORDS,),
        "Take values only from the user's messages, never from the assistant's replies.",
    ),
    Operator(
        "normalized",
        (wf.MISREAD,),
        f"As each value, write a {NORMALIZED_PHRASE} for the user's situation (an amount, a "
        "frequency, a choice) rather than a whole sentence.",
        replaces=("own_words",),
    ),
)
BY_KEY = {op.key: op for op in OPERATORS}

SLOT_SYSTEM = """\
You help improve the instructions of an AI assistant's memory writer. From the evaluation \
feedback, list the kinds of information about a user that its memory most often failed to \
hold. Answer with JSON: {"kinds": "a comma-separated list of at most six kinds, each two or \
three words"}. Name kinds, never a value a user gave."""
SLOT_SENTENCE = "Pay special attention to: {kinds}."


class EditsSettings(BaseModel):
    """Settings of the edits evolver (`settings: {edits: {...}}`)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "2" is not a number here

    candidates: int = Field(
        5,
        ge=1,
        le=16,
        description="edits screened per predictor and step (5: a compound edit and the best "
        "single ones are screened together)",
    )
    compound: bool = Field(
        True,
        strict=True,
        description="also propose compound edits: the two or three sentences (operators, and "
        "the removal of a restrictive sentence) that address one named failure, together",
    )
    max_words: int = Field(
        250, ge=8, description="words a prompt may have after an edit (longer: refused)"
    )
    slot: bool = Field(
        False,
        strict=True,
        description="also ask the optimizer model to fill one short slot (kinds of information "
        "to attend to) from the feedback",
    )
    slot_words: int = Field(24, ge=3, le=60, description="words the slot's fill may have")
    max_tokens: int = Field(64, ge=8, description="cap of the slot's reply")
    feedback_chars: int = Field(
        4000, ge=200, description="the feedback the slot's request shows, in characters"
    )
    max_examples: int = Field(
        2,
        ge=0,
        le=MAX_EXAMPLES,
        description="worked examples the evolver may add to a prompt, one per edit (0: no "
        "example edits). 2 by benchmarks/examples_curve.py's pre-registered rule: on the 1.5B "
        "writer 2 examples raised a weak seed's state_prob by +0.032 (12 of 16 users up), 4 did "
        "no better, and on a good prompt 2 made no significant difference (-0.012)",
    )
    examples_seed: int = Field(0, description="the seed the worked examples are drawn with")
    screen_takes: ScreenTakes = screen_takes_field()
    screen_budget: int | None = Field(
        3,
        ge=1,
        description="candidates screened on every training user; with more, successive "
        "halving screens all of them on half the users first and only the best this many go "
        "on (None: every candidate on every user)",
    )
    setting_edits: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="policy options the evolver may also change, each with the values to try "
        "(e.g. {verbatim: [user, user+edits], adapter: [chat]}): a setting edit is screened "
        "and recorded like a sentence edit (policies/config.py SETTINGS_KEY); checked against "
        "the policy before the run starts",
    )


SETTING_FAILURES: dict[str, tuple[str, ...]] = {
    # storing each user message as said: nothing the user said goes unwritten, no assistant words
    "verbatim": (wf.NEVER_WRITTEN, wf.ASSISTANT_WORDS, wf.UPDATE_LOST),
    "short_term_len": (wf.NEVER_WRITTEN,),
    "update_freq": (wf.NEVER_WRITTEN,),
}
"""The named failures each setting edit addresses (others: none; ranked after those that do)."""

EXAMPLE_FAILURES = (wf.ASSISTANT_WORDS, wf.UPDATE_LOST, wf.COLLISION, wf.NEVER_WRITTEN)
"""The named failures the worked examples show the way out of (optimize/evolvers/examples.py)."""


@dataclass
class Candidate:
    edit: str  # e.g. "add own_words", "remove s3", "slot", "compound never written: ..."
    text: str  # the predictor's prompt after the edit
    addresses: dict[str, int]  # the named failures it answers, with their counts
    changes: list[str]  # what happened to the sentences

    def shown(self, width: int = 160) -> str:
        """The edit with what it does to the sentences, cut to `width` characters."""
        text = f"{self.edit} [{' | '.join(self.changes)}]"
        return text if len(text) <= width else text[: width - 3] + "..."


def validate(text: str, old: str, request: str, max_words: int) -> str | None:
    """Why the proposed prompt `text` is refused, or None.

    Empty, the same as `old`, over-long (more than `max_words`), truncated (no sentence
    ending), JSON-shaped (braces, or a quoted key followed by a colon), copying 8 words in a
    row of the `request` (the feedback it was proposed from) or one of its snake_case field
    names (the 1.5B model filled the slot with "user_information_updates,
    question_answer_history" in the evidence run), unless `old` already holds them.
    """
    words = text.split()
    if not words:
        return "empty"
    if " ".join(words) == " ".join(old.split()):
        return "no change"
    if len(words) > max_words:
        return f"over-long ({len(words)} words, at most {max_words})"
    if not text.rstrip().endswith(SENTENCE_ENDINGS):
        return "truncated (no sentence ending)"
    if re.search(r"[{}]|\"\s*:\s*[\"\[{\d]", text) and not re.search(r"[{}]", old):
        return "JSON-shaped"
    theirs = _shingles(request) - _shingles(old)
    if _shingles(text) & theirs:
        return "copies the request (8 words in a row of the feedback)"
    keys = {k for k in re.findall(r'"(\w+)"\s*:', request) if "_" in k and k not in old}
    copied = sorted(k for k in keys if re.search(rf"\b{re.escape(k)}\b", text))
    if copied:
        return f"copies the request's field names ({', '.join(copied)})"
    return None


def validate_edit(text: str, old: str, request: str, max_words: int) -> str | None:
    """`validate` on the instructions; an examples block is memloop's own text, not checked.

    An edit that changes only the examples is refused only when it changes nothing.
    """
    head, old_head = split_examples(text)[0], split_examples(old)[0]
    if " ".join(head.split()) == " ".join(old_head.split()) and text != old:
        return None  # the examples block only
    return validate(head, old_head, request, max_words)


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = [w.lower().strip(".,;:!?\"'()") for w in text.split()]
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def named_failures(inputs: EvolveInput) -> dict[str, int]:
    """{named failure: wrong pairs} from the feedback's state reads ({} without them)."""
    block = inputs.summary.header.get("state_reads") or {}
    return {k: int(v) for k, v in (block.get("wrong_by_failure") or {}).items()}


class EditsEvolver:
    """Chooses edits from named failures; screens them by replay; the gate decides."""

    name = "edits"
    Settings = EditsSettings
    confirms = "last"  # its own screens accept edits: the last cycle is its candidate

    def __init__(
        self, client: ChatClient | None, settings: EditsSettings | None = None, **overrides
    ):
        self.client = client  # asked only for the slot (`slot: true`)
        self.settings = settings or EditsSettings(**overrides)

    def candidates(
        self, name: str, text: str, counts: dict[str, int], slot_fill: str | None = None
    ) -> list[Candidate]:
        """Every edit of `text` the operators make, best-ranked first (no tabu, no validator)."""
        head, n_examples = split_examples(text)
        seed = self.settings.examples_seed

        def keep(new_head: str) -> str:  # the examples block, in the new head's value style
            return with_examples(new_head, n_examples, seed) if n_examples else new_head

        units = core_units(head)
        present = " ".join(head.split())
        out: list[tuple[int, int, Candidate]] = []
        for rank, op in enumerate(OPERATORS):
            if op.sentence in present:
                continue
            kept = [u for u in units if not any(BY_KEY[r].sentence == u[1] for r in op.replaces)]
            gone = [u for u in units if u not in kept]
            line = max((u[2] for u in units), default=-1) + 1
            new = keep(render_core([*kept, ("new", op.sentence, line)]))
            changes = [f"added ({op.key}): {op.sentence}"] + [
                f"removed {u[0]} (switched value style): {u[1]}" for u in gone
            ]
            hit = _addressed(op.addresses, counts)
            out.append((-sum(hit.values()), rank, Candidate(f"add {op.key}", new, hit, changes)))
        unwritten = counts.get(wf.NEVER_WRITTEN, 0)
        if len(units) > 1:
            for uid, sentence, _ in units:
                restrictive = bool(RESTRICTIVE.search(sentence))
                hit = {wf.NEVER_WRITTEN: unwritten} if restrictive and unwritten else {}
                new = keep(render_core([u for u in units if u[0] != uid]))
                cand = Candidate(f"remove {uid}", new, hit, [f"removed {uid}: {sentence}"])
                out.append((-sum(hit.values()), len(OPERATORS) + (0 if restrictive else 1), cand))
        if self.settings.compound:
            out += [
                (-sum(c.addresses.values()), -1, c) for c in self.compounds(units, counts, keep)
            ]
        if slot_fill:
            sentence = SLOT_SENTENCE.format(kinds=slot_fill.rstrip(". "))
            line = max((u[2] for u in units), default=-1) + 1
            new = keep(render_core([*units, ("new", sentence, line)]))
            hit = {wf.NEVER_WRITTEN: unwritten} if unwritten else {}
            out.append(
                (
                    -sum(hit.values()),
                    len(OPERATORS),
                    Candidate(
                        "slot",
                        new,
                        hit,
                        [f"added (slot filled by the optimizer model): {sentence}"],
                    ),
                )
            )
        if n_examples < self.settings.max_examples:
            hit = _addressed(EXAMPLE_FAILURES, counts)
            new = with_examples(head, n_examples + 1, seed)
            added = new.splitlines()[-1]
            out.append(
                (
                    -sum(hit.values()),
                    len(OPERATORS),
                    Candidate("add example", new, hit, [f"added a worked example: {added}"]),
                )
            )
        if n_examples:
            cand = Candidate("drop examples", head, {}, [f"removed the {n_examples} examples"])
            out.append((0, len(OPERATORS) + 1, cand))
        out.sort(key=lambda x: (x[0], x[1]))
        return [c for _, _, c in out]

    def setting_candidates(self, text: str, counts: dict[str, int]) -> list[Candidate]:
        """Every setting edit of `setting_edits` away from the current settings `text`."""
        current = parse_settings(text, "settings")
        out: list[tuple[int, int, Candidate]] = []
        for rank, (key, values) in enumerate(self.settings.setting_edits.items()):
            for value in values:
                if key in current and current[key] == value:
                    continue
                was = repr(current[key]) if key in current else "the policy's own"
                new = settings_text({**current, key: value})
                hit = _addressed(SETTING_FAILURES.get(key, ()), counts)
                cand = Candidate(
                    f"set {key}: {value}", new, hit, [f"set {key}: {value} (was {was})"]
                )
                out.append((-sum(hit.values()), rank, cand))
        out.sort(key=lambda x: (x[0], x[1]))
        return [c for _, _, c in out]

    @staticmethod
    def compounds(units: list[Any], counts: dict[str, int], keep: Any) -> list[Candidate]:
        """Per named failure found (most wrong pairs first), the edits that address it together.

        Its operators not in the prompt yet (of two that replace each other, the first) and,
        for facts never written, the removal of each restrictive sentence; at most 3 parts, and
        only when there are 2 or more. `units` are the prompt's sentences (playbook.core_units),
        `keep` puts the examples block back.
        """
        present = {u[1] for u in units}
        out, seen = [], set()
        for failure, _ in sorted(counts.items(), key=lambda fc: (-fc[1], fc[0])):
            if not counts.get(failure):
                continue
            ops: list[Operator] = []
            for op in OPERATORS:
                if failure not in op.addresses or op.sentence in present:
                    continue
                if any(r in {o.key for o in ops} for r in op.replaces):
                    continue  # of two value styles, the first
                ops.append(op)
            drop = []
            if failure == wf.NEVER_WRITTEN:
                drop = [u for u in units if RESTRICTIVE.search(u[1]) and len(units) > 1]
            parts = [("add", op) for op in ops] + [("remove", u) for u in drop]
            parts = parts[:3]
            if len(parts) < 2:
                continue
            added = [op for kind, op in parts if kind == "add"]
            removed = [u for kind, u in parts if kind == "remove"]
            gone = {u[0] for u in removed} | {
                u[0]
                for u in units
                for op in added
                if any(BY_KEY[r].sentence == u[1] for r in op.replaces)
            }
            kept = [u for u in units if u[0] not in gone]
            line = max((u[2] for u in units), default=-1) + 1
            new_units = [*kept, *(("new", op.sentence, line + i) for i, op in enumerate(added))]
            text = keep(render_core(new_units))
            if text in seen:
                continue
            seen.add(text)
            names = [f"add {op.key}" for op in added] + [f"remove {u[0]}" for u in removed]
            changes = [f"added ({op.key}): {op.sentence}" for op in added] + [
                f"removed {u[0]}: {u[1]}" for u in removed
            ]
            hit = _addressed(
                tuple(dict.fromkeys(f for op in added for f in op.addresses))
                + ((wf.NEVER_WRITTEN,) if removed else ()),
                counts,
            )
            edit = f"compound {failure.replace('_', ' ')}: " + " + ".join(names)
            out.append(Candidate(edit, text, hit, changes))
        return out

    def _slot(self, inputs: EvolveInput) -> tuple[str | None, str | None]:
        """(the slot's fill, why there is none)."""
        if self.client is None:
            return None, "no optimizer model for the slot"
        feedback = inputs.summary.fit(self.settings.feedback_chars).render()
        schema = {
            "type": "object",
            "properties": {"kinds": {"type": "string", "maxLength": 12 * self.settings.slot_words}},
            "required": ["kinds"],
            "additionalProperties": False,
        }
        result = self.client.chat_json(
            [
                {"role": "system", "content": SLOT_SYSTEM},
                {"role": "user", "content": f"Feedback:\n{feedback}"},
            ],
            schema,
            component="optimizer",
            sample=inputs.cycle,
            max_tokens=self.settings.max_tokens,
        )
        if result.json_error is not None:
            return None, f"slot reply unusable ({result.json_error})"
        fill = " ".join(str(result.parsed.get("kinds", "")).split())
        if not fill:
            return None, "slot reply empty"
        return fill, None

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        from memloop.optimize.replay_score import screen_options

        spent = self.client.usage.mark("optimizer") if self.client is not None else None
        counts = named_failures(inputs)
        request = inputs.summary.render()
        tabu = {(r.get("predictor"), r.get("text")) for r in inputs.rejected}
        step = EvolveStep(prompts=dict(inputs.prompts))
        slot_fill, slot_problem = (None, None)
        if self.settings.slot:
            slot_fill, slot_problem = self._slot(inputs)
        if slot_fill is not None:  # the one text a model wrote: checked before anything else
            sentence = SLOT_SENTENCE.format(kinds=slot_fill.rstrip(". "))
            hits = inputs.leaks.reject(sentence, "")
            limit = len(SLOT_SENTENCE.split()) + self.settings.slot_words
            problem = described(hits) if hits else validate(sentence, "", request, limit)
            if problem:
                stage = "leak check" if hits else "validator"
                for name in inputs.prompts:
                    step.rejected.append(refusal(name, "slot", "", stage, problem))
                slot_fill, slot_problem = None, f"slot fill refused ({stage}: {problem})"
        screened_tokens, screened_cost = 0, None
        found = _counts(counts)
        work = [
            (name, text, self.candidates(name, text, counts, slot_fill))
            for name, text in sorted(inputs.prompts.items())
            if name != SETTINGS_KEY
        ]
        if self.settings.setting_edits:
            now = inputs.prompts.get(SETTINGS_KEY, "")
            work.append((SETTINGS_KEY, now, self.setting_candidates(now, counts)))
        for name, text, proposed in work:
            notes = [f"named failures: {found}"]
            if slot_problem:
                notes.append(slot_problem)
            chosen: list[Candidate] = []
            skipped_tabu = 0

            def refuse(c: Candidate, stage: str, reason: str, name: str = name) -> None:
                step.rejected.append(refusal(name, c.edit, json_sha256(c.text), stage, reason))

            for cand in proposed:
                if len(chosen) >= self.settings.candidates:
                    break
                if (name, json_sha256(cand.text)) in tabu:
                    skipped_tabu += 1
                    continue
                problem = (
                    None  # settings: memloop's own text, checked against the policy at start
                    if name == SETTINGS_KEY
                    else validate_edit(cand.text, text, request, self.settings.max_words)
                )
                if problem:
                    refuse(cand, "validator", problem)
                    continue
                hits = inputs.leaks.reject(cand.text, text)
                if hits:
                    refuse(cand, "leak check", described(hits))
                    continue
                chosen.append(cand)
            if skipped_tabu:
                notes.append(f"{skipped_tabu} edits skipped: refused in an earlier step (tabu)")
            if not chosen:
                step.errors[name] = "; ".join([*notes, "no edit left to try"]) + "; kept"
                step.changes[name] = notes
                continue
            taken: Candidate | None
            if inputs.screen is None:
                taken, note = chosen[0], "no screen: took the best-ranked edit"
            else:
                choice = screen_options(
                    name,
                    inputs.prompts,
                    [c.text for c in chosen],
                    inputs.screen,
                    cycle=inputs.cycle,
                    takes=self.settings.screen_takes,
                    budget=self.settings.screen_budget,
                )
                screened_tokens += choice.tokens
                screened_cost = add_costs(screened_cost, choice.cost_usd)
                if choice.decision is not None:
                    step.decisions.append(choice.decision)
                note = choice.note
                for i, c in enumerate(chosen):
                    if i == choice.chosen:
                        continue
                    score = choice.scores[i] if i < len(choice.scores) else None
                    halved = i in choice.halved
                    base = choice.current_half if halved else choice.current
                    said = (
                        f"scored {format_number(score)} on replay, "
                        f"the current prompt {format_number(base)}"
                    )
                    if halved:
                        refuse(c, "screen", f"{said} on half the users (successive halving)")
                        continue
                    refuse(c, "screen" if choice.chosen is not None else "gate", said)
                taken = None if choice.chosen is None else chosen[choice.chosen]
            tried = "; ".join(f"{c.shown()} (addresses {_counts(c.addresses)})" for c in chosen)
            notes.append(f"candidates: {tried}")
            if taken is None:
                step.errors[name] = f"{note}; kept"
                step.changes[name] = [*notes, note]
                continue
            step.prompts[name] = taken.text  # a setting edit: the prompts' SETTINGS_KEY text
            step.changes[name] = [
                *notes,
                f"chose {taken.edit} (addresses {_counts(taken.addresses)})",
                *taken.changes,
                note,
            ]
        step.tokens = (spent.tokens() if spent else 0) + screened_tokens
        step.cost_usd = add_costs(spent.cost_usd() if spent else None, screened_cost)
        return step


def refusal(predictor: str, edit: str, text: str, stage: str, reason: str) -> dict[str, str]:
    """One entry of `EvolveStep.rejected`.

    `text` is the sha256 of the refused prompt ("" for a slot fill, refused before it made one).
    """
    return {"predictor": predictor, "edit": edit, "text": text, "stage": stage, "reason": reason}


def _addressed(failures: tuple[str, ...], counts: dict[str, int]) -> dict[str, int]:
    """{failure: wrong pairs} of the named `failures` an edit addresses that the feedback found."""
    return {f: counts[f] for f in failures if counts.get(f)}


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "no named failure"
