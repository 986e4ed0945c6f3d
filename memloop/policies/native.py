"""Native LLM memory: the whole conversation in context.

When the next request would not fit the endpoint's context window, the oldest turns are dropped,
and each drop is recorded.
"""

from __future__ import annotations

from typing import Any

from memloop.policies.base import (
    ASSISTANT_INTRO,
    BasePolicy,
    Message,
    estimate_messages_tokens,
    render_transcript,
)
from memloop.policies.config import NativeConfig

# Room left for what the estimate may miss (chat-template tokens, special tokens).
_SAFETY_TOKENS = 64


class NativePolicy(BasePolicy):
    kind = "native"
    config: NativeConfig

    def __init__(self, config: NativeConfig, client, workdir=None):
        super().__init__(config, client, workdir)
        self.kept: list[dict[str, Any]] = []  # {"index", "user", "assistant"}, oldest first
        self.dropped: list[int] = []  # indices of the turns dropped to fit the window

    # -- context ------------------------------------------------------------------------------

    def _prompt_budget(self) -> int | None:
        """Tokens the request may use, leaving room for the reply; None = no known limit."""
        window = self.client.endpoint.effective_context_window
        if window is None:
            return None
        # Room for the longest answer: a capped reply or an uncapped JSON probe answer.
        reply = max(self.config.reply_max_tokens or 0, self.client.endpoint.max_tokens or 0)
        return max(window - reply - _SAFETY_TOKENS, 0)

    def _messages(self, turns: list[dict[str, Any]], user_message: str) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": ASSISTANT_INTRO}]
        for turn in turns:
            messages.append({"role": "user", "content": turn["user"]})
            messages.append({"role": "assistant", "content": turn["assistant"]})
        messages.append({"role": "user", "content": user_message})
        return messages

    def _fitting_start(self, user_message: str) -> int:
        """How many of the oldest kept turns must go for the request to fit the budget."""
        budget = self._prompt_budget()
        if budget is None:
            return 0
        total = estimate_messages_tokens(self._messages([], user_message))
        total += sum(_turn_tokens(turn) for turn in self.kept)
        start = 0
        while start < len(self.kept) and total > budget:
            total -= _turn_tokens(self.kept[start])
            start += 1
        return start

    def _context(
        self, user_message: str, *, probe: bool, raw: bool = True
    ) -> tuple[list[Message], list[str]]:
        # The native policy's memory is the conversation it keeps: nothing is held unwritten, so
        # a memory-only probe (raw=False) sees the same turns. For a chat turn `_before_turn` has
        # already made room; a probe only trims its own copy.
        turns = self.kept[self._fitting_start(user_message) :] if probe else self.kept
        messages = self._messages(turns, user_message)
        return messages, [f"{m['role']}: {m['content']}" for m in messages[1:-1]]

    def _before_turn(self, user_message: str) -> None:
        super()._before_turn(user_message)
        start = self._fitting_start(user_message)
        if start:
            self.dropped.extend(turn["index"] for turn in self.kept[:start])
            del self.kept[:start]

    def _remember(self, user_message: str, assistant_message: str) -> None:
        self.kept.append(
            {"index": self.turns - 1, "user": user_message, "assistant": assistant_message}
        )

    # -- views and state ----------------------------------------------------------------------

    def memory_view(self) -> str:
        lines = []
        if self.dropped:
            lines.append(
                f"[{len(self.dropped)} earlier turns no longer fit the context window "
                f"and were dropped: turns {_ranges(self.dropped)}]"
            )
        for turn in self.kept:
            lines.append(
                render_transcript(
                    [
                        {"role": "user", "content": turn["user"]},
                        {"role": "assistant", "content": turn["assistant"]},
                    ]
                )
            )
        return "\n".join(lines) if lines else "(empty conversation)"

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "kept_turns": len(self.kept), "dropped_turns": len(self.dropped)}

    def _state(self) -> dict[str, Any]:
        return {"kept": self.kept, "dropped": self.dropped}

    def _restore(self, state: dict[str, Any]) -> None:
        self.kept = [dict(turn) for turn in state["kept"]]
        self.dropped = [int(i) for i in state["dropped"]]


def _turn_tokens(turn: dict[str, Any]) -> int:
    return estimate_messages_tokens(
        [
            {"role": "user", "content": turn["user"]},
            {"role": "assistant", "content": turn["assistant"]},
        ]
    )


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)
