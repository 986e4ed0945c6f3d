"""The Policy contract: the only way the environment touches an assistant under test.

Structural (a Protocol), so `policies/` implements it without importing the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class AnswerLike(Protocol):
    """What `Policy.answer` returns."""

    text: str  # the raw answer text
    retrieved_memories: list[str]  # the memories the policy put in context for this answer
    parsed: Any  # the JSON value when a schema was given and it validated
    json_error: str | None  # why the text did not validate (None when it did)


@runtime_checkable
class Policy(Protocol):
    name: str

    def respond(self, user_message: str) -> str:
        """One chat turn; the policy may write memory on its own schedule."""

    def ingest(self, user_message: str, assistant_message: str) -> None:
        """Take in a recorded turn (off-policy replay) exactly as if it had been held."""

    def answer(
        self, prompt: str, *, schema: dict[str, Any] | None = None, memory_only: bool = False
    ) -> AnswerLike:
        """A probe: answer from memory, never writing memory.

        `memory_only=True` (the state queries) answers from WRITTEN memory alone: no message held
        raw and not yet written, no recent turns kept beside the memory. That makes the state
        accuracy a measure of what the memory writer stored. A policy whose memory is the
        conversation itself (the native LLM) answers as it would anyway.

        Optional: a keyword `top_logprobs: int | None = None`. When it is given, answer with one
        token and set the answer's `top_logprobs` to that token's alternatives [(token,
        logprob)] (None when the model gives none): the letter read of the state queries
        (`probes.state_read: letters`). A policy without the keyword is never passed it, and
        gives no state_prob.
        """

    def memory_view(self) -> str:
        """What the policy has written to its memory, rendered as text.

        Factual recall is judged on it, so it must not include messages held raw and not yet
        written (a buffer): those would be credited whatever the write prompt does. A policy whose
        memory is the conversation itself (the native LLM) shows the turns it keeps.
        """

    def unwritten_messages(self) -> int:
        """Messages taken in (chat turns count two) but not yet handed to the memory writer.

        0 for a policy whose memory is everything it took in. Read after each period to know
        which of the user's revealed values memory could hold at probe time.
        """

    def prompts(self) -> dict[str, str]:
        """The mutable memory-write prompts: {predictor name: instructions}."""

    def with_prompts(self, prompts: dict[str, str], *, keep_memory: bool = False) -> Policy:
        """A new policy using these prompts; self is unchanged.

        It has fresh memory, or a copy of this one's when keep_memory (for evolving inside an
        episode).
        """

    def save(self, directory: Path) -> None:
        """Persist the full state (memory, buffers, prompts) for a checkpoint."""

    def load(self, directory: Path) -> Policy:
        """Restore a state written by `save` into this policy; returns self."""

    def close(self) -> None:
        """Release files and clients."""
