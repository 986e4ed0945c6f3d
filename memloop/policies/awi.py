"""AWI, agentic write in-context: labelled facts in the system prompt, kept up to date by an LLM.

The LLM writer (the DSPy predictor `writer`) reads the oldest raw messages every `update_freq`
messages while the newest `short_term_len` stay raw in context.

Differences from the published agent: an edit with value null deletes a label; entries carry the
write step and simulated time instead of wall-clock time; labels are normalised (snake_case) so
'Home city' and 'home_city' are one fact; a failed write is counted, not silently lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import dspy

from memloop.core.words import content_words
from memloop.policies.base import (
    _TIME_TAG,
    BufferedMemoryPolicy,
    Message,
    MessageBuffer,
    render_transcript,
)
from memloop.policies.config import AWIConfig
from memloop.policies.programs import (
    AWIProgram,
    load_program,
    program_prompts,
    save_program,
    structured_lm,
    unwrap_user_error,
)

PROGRAM_FILE = "program.json"


def writer_adapter(name: str, lm: Any) -> Any:
    """The DSPy adapter of the `adapter:` option (AWIConfig); two_step extracts with `lm`."""
    if name == "chat":
        return dspy.ChatAdapter()
    if name == "xml":
        return dspy.XMLAdapter()
    if name == "two_step":
        return dspy.TwoStepAdapter(extraction_model=lm)
    return dspy.JSONAdapter()


def normalize_label(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.strip().lower()).strip("_")


def apply_edits(
    facts: dict[str, dict[str, Any]], edits: Iterable[Any], *, step: int, time: str | None
) -> dict[str, int]:
    """Merge writer edits into `facts` in place; returns counts of set / deleted / ignored.

    Each edit has `label` and `value`: a string sets the label (a changed value records this step
    and time; an unchanged value keeps its original ones), None deletes it, an empty string or an
    empty label is ignored. Later edits win.
    """
    counts = {"set": 0, "deleted": 0, "ignored": 0}
    for edit in edits:
        label = normalize_label(_field(edit, "label") or "")
        value = _field(edit, "value")
        if not label:
            counts["ignored"] += 1
        elif value is None:
            counts["deleted" if facts.pop(label, None) is not None else "ignored"] += 1
        elif not str(value).strip():
            counts["ignored"] += 1
        else:
            value = " ".join(str(value).split())
            old = facts.get(label)
            if old is None or old["value"] != value:
                facts[label] = {"value": value, "step": step, "time": time}
            counts["set"] += 1
    return counts


def _shares_word(words: set[str], source: set[str]) -> bool:
    """Whether a word of `words` is in `source`, up to its ending (first 5 letters)."""
    stems = {w[:5] for w in source}
    return any(w[:5] in stems for w in words)


def grounded(label: str, value: str, user_text: str) -> bool:
    """Whether a written (label, value) comes from what the user said.

    The value must share a word with the user's messages; a value without content words ("yes",
    "2") leans on its label instead. A value the user never gave ("home_city: New York" from an
    excerpt about reading habits, "capital_of_france: Paris" from a question) is not grounded. A
    paraphrase sharing no word with the user (told "Berlin", written "Germany") is dropped too:
    the price of the check.
    """
    source = content_words(user_text)
    words = content_words(value)
    if not words:
        words = content_words(label.replace("_", " "))
    return _shares_word(words, source)


def _field(edit: Any, name: str) -> Any:
    return edit.get(name) if isinstance(edit, dict) else getattr(edit, name, None)


class AWIPolicy(BufferedMemoryPolicy):
    kind = "awi"
    config: AWIConfig

    def __init__(
        self, config: AWIConfig, client, workdir=None, prompts: dict[str, str] | None = None
    ):
        super().__init__(config, client, workdir)
        self.program = AWIProgram(**(prompts or {}))
        self._lm = structured_lm(client, "memory")
        self.facts: dict[str, dict[str, Any]] = {}
        self.buffer = MessageBuffer(config.update_freq, config.short_term_len)
        self.writes = 0  # writer calls that returned edits
        self.write_errors = 0  # writer calls whose answer could not be parsed
        self.last_write_error: str | None = None
        self.ungrounded = 0  # written values dropped: they share no word with the user's messages

    # -- prompts ------------------------------------------------------------------------------

    def prompts(self) -> dict[str, str]:
        return program_prompts(self.program)

    def _fresh(self, prompts: dict[str, str]) -> AWIPolicy:
        return AWIPolicy(self.config, self.client, self.workdir, prompts=prompts)

    def adopt_program(self, program: Any) -> None:
        """Write with `program` (a loaded AWIProgram, e.g. `dspy.load`'s): it runs every write."""
        self.program = program

    # -- reading ------------------------------------------------------------------------------

    def fact_lines(self) -> list[str]:
        return [f"{label}: {self.facts[label]['value']}" for label in sorted(self.facts)]

    def _context(
        self, user_message: str, *, probe: bool, raw: bool = True
    ) -> tuple[list[Message], list[str]]:
        facts = self.fact_lines()
        header = "What you remember about the user (label: value; each value is the latest known)"
        messages = self._memory_messages(user_message, header, facts, "(nothing yet)", raw=raw)
        return messages, facts

    # -- writing ------------------------------------------------------------------------------

    def _write(self, batch: list[Message], time: str | None) -> None:
        if self.config.verbatim != "off":
            n_said = sum(1 for label in self.facts if label.startswith("said_"))
            for m in batch:
                text = " ".join(_TIME_TAG.sub(" ", m["content"]).split())
                if m["role"] == "user" and text:
                    n_said += 1
                    self.facts[f"said_{n_said}"] = {
                        "value": text,
                        "step": self.writes,
                        "time": time,
                    }
            if self.config.verbatim == "user":
                return
        current = json.dumps(
            {label: self.facts[label]["value"] for label in sorted(self.facts)}, ensure_ascii=False
        )
        try:
            with dspy.context(lm=self._lm, adapter=writer_adapter(self.config.adapter, self._lm)):
                prediction = self.program(memory=current, conversation=render_transcript(batch))
        except Exception as exc:
            user_error = unwrap_user_error(exc)
            if user_error is not None:
                raise user_error from None
            self.write_errors += 1
            self.last_write_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return
        self.writes += 1
        edits = list(prediction.edits or [])
        if self.config.grounded_values:
            said = " ".join(m["content"] for m in batch if m["role"] == "user")
            kept = [
                e
                for e in edits
                if _field(e, "value") is None
                or grounded(str(_field(e, "label") or ""), str(_field(e, "value")), said)
            ]
            self.ungrounded += len(edits) - len(kept)
            edits = kept
        apply_edits(self.facts, edits, step=self.writes, time=time)

    # -- views and state ----------------------------------------------------------------------

    def memory_view(self) -> str:
        facts = self.fact_lines()
        # written memory only, never the unwritten buffer; an empty memory renders as nothing
        # (it supports no claim)
        return "\n".join(["Memory (label: value):", *facts]) if facts else ""

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "facts": len(self.facts),
            "writes": self.writes,
            "write_errors": self.write_errors,
            "ungrounded_values": self.ungrounded,
            "buffered_messages": len(self.buffer.messages),
        }

    def _state(self) -> dict[str, Any]:
        return {
            "facts": self.facts,
            "buffer": self.buffer.state(),
            "writes": self.writes,
            "write_errors": self.write_errors,
            "last_write_error": self.last_write_error,
            "ungrounded": self.ungrounded,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.facts = {label: dict(entry) for label, entry in state["facts"].items()}
        self.buffer = MessageBuffer.from_state(
            self.config.update_freq, self.config.short_term_len, state["buffer"]
        )
        self.writes = int(state["writes"])
        self.write_errors = int(state["write_errors"])
        self.last_write_error = state.get("last_write_error")
        self.ungrounded = int(state.get("ungrounded", 0))

    def _save_extra(self, directory: Path) -> None:
        save_program(self.program, directory / PROGRAM_FILE)

    def _load_extra(self, directory: Path) -> None:
        load_program(self.program, directory / PROGRAM_FILE)
