"""A fake factual-recall checker that reads the notes, for fake-server replies.

It answers the recall check (feedback.probes.RECALL_PROMPT: notes between <notes> tags, then
numbered claims "N. The user's <variable> is: <value>.") "yes" exactly when the claimed value's
words appear in the notes (as whole words, any case), so it passes the checker calibration
(feedback.calibration) where a checker saying "yes" to everything fails it.
"""

from __future__ import annotations

import json
import re
from typing import Any

CLAIMS_HEADER = "Claims about the user's current situation:"
_CLAIM = re.compile(r"^(\d+)\. The user's .* is: (.*)\.$")


def _prompt(body: dict[str, Any]) -> str:
    messages = body.get("messages") or [{}]
    return str(messages[-1].get("content", ""))


def is_recall_request(body: dict[str, Any]) -> bool:
    """A factual-recall check (notes and numbered claims about the user)."""
    text = _prompt(body)
    return "<notes>" in text and "</notes>" in text and CLAIMS_HEADER in text


def recall_verdicts(body: dict[str, Any]) -> dict[str, str]:
    """{claim number: "yes" | "no"}: "yes" when the claimed value's words are in the notes."""
    text = _prompt(body)
    notes = text.split("<notes>", 1)[1].split("</notes>", 1)[0].lower()
    verdicts = {}
    for line in text.split(CLAIMS_HEADER, 1)[1].splitlines():
        match = _CLAIM.match(line.strip())
        if match:
            value = re.escape(match.group(2).lower())
            verdicts[match.group(1)] = "yes" if re.search(rf"\b{value}\b", notes) else "no"
    return verdicts


def notes_checker(body: dict[str, Any]) -> str:
    """A FakeOpenAIServer reply for recall checks (`recall_verdicts` as JSON)."""
    return json.dumps(recall_verdicts(body))
