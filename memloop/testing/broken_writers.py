"""Planted broken memory writers: AWI with a known write failure and no model call to write.

Each is the failure a memory-health alarm (feedback/health.py) must see:

- `SilentWriter` takes every message and stores nothing (`nothing_stored`);
- `ReplyWriter` stores the assistant's reply instead of the user's words (`assistant_words`), as
  the quickstart's writer stored its own advice;
- `OneLabelWriter` stores the user's words, always under the one label `note`, so each write
  overwrites the fact before it (`label_reuse`);
- `ErrorWriter` fails every write, counted in `write_errors` as AWI counts a reply it cannot
  parse (`write_errors`).

The replies and probes are the policy's own (AWI's, on the client given). Built from an
`AWIConfig`, or from a plug-in YAML's options (`type: memloop.testing.broken_writers:ReplyWriter`
and AWI's keys), so `memloop eval` runs them as it runs any policy.
"""

from __future__ import annotations

from typing import Any

from memloop.policies.awi import AWIPolicy
from memloop.policies.base import _TIME_TAG, Message
from memloop.policies.config import AWIConfig


def _said(batch: list[Message], role: str) -> str:
    return " ".join(
        " ".join(_TIME_TAG.sub(" ", m["content"]).split()) for m in batch if m["role"] == role
    ).strip()


class _Planted(AWIPolicy):
    def __init__(self, config: Any, client: Any, workdir: Any = None, prompts: Any = None):
        if not isinstance(config, AWIConfig):
            config = AWIConfig(**{"type": "awi", **dict(config)})
        super().__init__(config, client, workdir, prompts=prompts)

    def _fresh(self, prompts: dict[str, str]) -> AWIPolicy:
        return type(self)(self.config, self.client, self.workdir, prompts=prompts)

    def _set(self, label: str, value: str, time: str | None) -> None:
        if value:
            self.writes += 1
            self.facts[label] = {"value": value, "step": self.writes, "time": time}


class SilentWriter(_Planted):
    name = "silent"

    def _write(self, batch: list[Message], time: str | None) -> None:
        self.writes += 1  # the write ran and stored nothing


class ReplyWriter(_Planted):
    name = "reply"

    def _write(self, batch: list[Message], time: str | None) -> None:
        self._set(f"reply_{self.writes + 1}", _said(batch, "assistant"), time)


class OneLabelWriter(_Planted):
    name = "one-label"

    def _write(self, batch: list[Message], time: str | None) -> None:
        self._set("note", _said(batch, "user"), time)


class ErrorWriter(_Planted):
    name = "error"

    def _write(self, batch: list[Message], time: str | None) -> None:
        self.write_errors += 1
        self.last_write_error = "ValueError: planted: the writer's answer did not parse"


BROKEN = {
    "nothing_stored": SilentWriter,
    "assistant_words": ReplyWriter,
    "label_reuse": OneLabelWriter,
    "write_errors": ErrorWriter,
}  # each alarm of feedback/health.ALARMS -> the planted writer it must see
