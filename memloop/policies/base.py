"""What every policy shares.

The Answer record, the turn loop (respond = context -> reply -> ingest), the message buffer of the
buffered policies, token estimates and checkpoint files.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json
from memloop.llm.client import ChatClient

Message = dict[str, str]

STATE_FILE = "policy.json"
STATE_FORMAT = 1

# The environment prefixes the first message of a session with the simulated time.
_TIME_TAG = re.compile(r"\[Current Time:\s*([^\]\n]+?)\s*\]")

ASSISTANT_INTRO = (
    "You are a personal assistant in one long, ongoing conversation with the same user. "
    "Give advice that fits the user's situation as it is now. Where two things you know about "
    "the user disagree, the more recent one is the current truth."
)


@dataclass
class Answer:
    """The result of a probe (`Policy.answer`)."""

    text: str
    retrieved_memories: list[str] = field(default_factory=list)
    parsed: Any = None
    json_error: str | None = None
    # a one-token answer's top alternatives [(token, logprob)] when asked (`top_logprobs`), None
    # when not asked or when the endpoint returned none
    top_logprobs: list[tuple[str, float]] | None = None


def simulated_time(text: str) -> str | None:
    """The simulated time a message is stamped with, if any."""
    match = _TIME_TAG.search(text)
    return match.group(1) if match else None


def estimate_tokens(text: str) -> int:
    """A deliberately high token estimate that needs no tokenizer.

    1 token per 3 ASCII characters (English averages about 4) and 1 per other character (CJK text is
    about 1-1.5 per token).
    """
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return math.ceil(ascii_chars / 3) + (len(text) - ascii_chars)


def estimate_messages_tokens(messages: list[Message]) -> int:
    """Tokens of a chat request: content plus a per-message allowance for the chat template."""
    return sum(estimate_tokens(m["content"]) + 8 for m in messages)


def memoryless_messages(user_message: str) -> list[Message]:
    """A chat request that holds the current user message only: no memory, no earlier turns.

    The request of a policy with `reply_memory: false` and of a record-only evaluation
    (`memloop eval --record-only`): the same text, so one response cache serves both.
    """
    return [
        {"role": "system", "content": ASSISTANT_INTRO},
        {"role": "user", "content": user_message},
    ]


def render_transcript(messages: list[Message]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class MessageBuffer:
    """Raw recent messages.

    Once `update_freq + short_term_len` messages are waiting, the oldest `update_freq` are handed to
    the memory writer, so the newest `short_term_len` stay raw. Each message keeps the simulated
    time current when it was said (kept apart from the messages, which go to the chat API as they
    are).
    """

    def __init__(
        self,
        update_freq: int,
        short_term_len: int,
        messages: list[Message] | None = None,
        times: list[str | None] | None = None,
    ):
        self.update_freq = update_freq
        self.short_term_len = short_term_len
        self.messages: list[Message] = [dict(m) for m in messages or []]
        self.times: list[str | None] = (
            list(times) if times is not None else ([None] * len(self.messages))
        )
        if len(self.times) != len(self.messages):
            raise ValueError("one time per buffered message expected")

    def append(self, role: str, content: str, time: str | None = None) -> None:
        self.messages.append({"role": role, "content": content})
        self.times.append(time)

    def due_batches(self) -> Iterator[tuple[list[Message], str | None]]:
        """Pop the batches due for a write, oldest first, each with the time of its last message."""
        while len(self.messages) >= self.update_freq + self.short_term_len:
            batch = self.messages[: self.update_freq]
            time = self.times[self.update_freq - 1]
            del self.messages[: self.update_freq]
            del self.times[: self.update_freq]
            yield batch, time

    def state(self) -> dict[str, Any]:
        return {"messages": self.messages, "times": self.times}

    @classmethod
    def from_state(
        cls, update_freq: int, short_term_len: int, state: dict[str, Any]
    ) -> MessageBuffer:
        return cls(update_freq, short_term_len, state["messages"], state["times"])


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise UserError(f"{path}: no such file (not a policy checkpoint folder?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}): a damaged checkpoint"
        ) from None


class BasePolicy:
    """The turn loop shared by all policies.

    A subclass supplies `_context` (the messages sent for a user message, and the memories placed in
    them), `_remember` (take in a finished turn) and its state for checkpoints.
    """

    kind: ClassVar[str]

    def __init__(self, config: Any, client: ChatClient, workdir: Path | str | None = None):
        self.config = config
        self.client = client
        self.workdir = Path(workdir) if workdir is not None else None
        self.name: str = config.display_name
        self.turns = 0  # turns taken in (held or replayed)
        self.sim_time: str | None = None  # latest simulated time seen in a user message

    # -- the Policy contract ------------------------------------------------------------------

    def respond(self, user_message: str) -> str:
        self._before_turn(user_message)
        if self.config.reply_memory:
            messages, _ = self._context(user_message, probe=False)
        else:  # the conversation does not depend on the memory (or its write prompts)
            messages = memoryless_messages(user_message)
        reply = self.client.chat(
            messages, component="agent", max_tokens=self.config.reply_max_tokens
        ).text
        self._after_turn(user_message, reply)
        return reply

    def ingest(self, user_message: str, assistant_message: str) -> None:
        self._before_turn(user_message)
        self._after_turn(user_message, assistant_message)

    def answer(
        self,
        prompt: str,
        *,
        schema: dict[str, Any] | None = None,
        memory_only: bool = False,
        top_logprobs: int | None = None,
    ) -> Answer:
        messages, retrieved = self._context(prompt, probe=True, raw=not memory_only)
        # A schema-bound answer keeps the endpoint's cap: a short reply cap could cut its JSON.
        cap = self.config.reply_max_tokens if schema is None else None
        if top_logprobs:  # one token, with its alternatives (feedback/probes.py's letter read)
            cap = 1
        result = self.client.chat(
            messages, component="probe", schema=schema, max_tokens=cap, top_logprobs=top_logprobs
        )
        return Answer(
            text=result.text,
            retrieved_memories=retrieved,
            parsed=result.parsed,
            json_error=result.json_error,
            top_logprobs=result.top_logprobs[0] if result.top_logprobs else None,
        )

    def prompts(self) -> dict[str, str]:
        return {}

    def with_prompts(self, prompts: dict[str, str], *, keep_memory: bool = False) -> BasePolicy:
        """A new policy using `prompts`; self is unchanged.

        The new policy has fresh memory, or (keep_memory, for evolving inside an episode) continues
        with a copy of this policy's memory.
        """
        merged = self._merge_prompts(prompts)
        if not keep_memory:
            return self._fresh(merged)
        with tempfile.TemporaryDirectory(prefix="memloop-swap-") as tmp:
            self.save(tmp)
            twin = self._fresh(merged)
            twin.load(tmp)  # restores the memory, and with it the old prompts...
        twin._replace_prompts(merged)  # ...which are replaced again
        return twin

    def _replace_prompts(self, prompts: dict[str, str]) -> None:
        program = getattr(self, "program", None)
        if program is None:
            return
        for name, predictor in program.named_predictors():
            if name in prompts:
                predictor.signature = predictor.signature.with_instructions(prompts[name])
        sync = getattr(self, "_sync_prompts", None)
        if sync is not None:
            sync()

    def memory_view(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def unwritten_messages(self) -> int:
        """Messages taken in but not yet handed to memory (0: everything taken in is memory)."""
        return 0

    def stats(self) -> dict[str, Any]:
        """Counters worth recording with a period (writes, failures, drops)."""
        return {"turns": self.turns}

    def save(self, directory: Path | str) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_extra(directory)
        atomic_write_json(
            directory / STATE_FILE,
            sort_keys=True,
            value={
                "format": STATE_FORMAT,
                "type": self.kind,
                "name": self.name,
                "config": self.config.model_dump(mode="json"),
                "turns": self.turns,
                "sim_time": self.sim_time,
                "state": self._state(),
            },
        )

    def load(self, directory: Path | str) -> BasePolicy:
        directory = Path(directory)
        data = read_json(directory / STATE_FILE)
        if not isinstance(data, dict):
            raise UserError(
                f"{directory / STATE_FILE}: not a policy checkpoint (not a JSON object)"
            )
        if data.get("format") != STATE_FORMAT or data.get("type") != self.kind:
            raise UserError(
                f"{directory / STATE_FILE}: a checkpoint of a {data.get('type')!r} "
                f"policy (format {data.get('format')}), not of {self.kind!r} "
                f"(format {STATE_FORMAT})"
            )
        damaged = f"{directory / STATE_FILE}: a damaged checkpoint (missing or malformed"
        try:
            self.turns = int(data["turns"])
            state = data["state"]
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{damaged} {exc})") from None
        self.sim_time = data.get("sim_time")
        self._load_extra(directory)
        try:
            self._restore(state)
        except (KeyError, TypeError) as exc:
            raise UserError(f"{damaged} {exc})") from None
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> BasePolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} turns={self.turns}>"

    # -- hooks --------------------------------------------------------------------------------

    def _before_turn(self, user_message: str) -> None:
        stamp = simulated_time(user_message)
        if stamp is not None:
            self.sim_time = stamp

    def _after_turn(self, user_message: str, assistant_message: str) -> None:
        self.turns += 1
        self._remember(user_message, assistant_message)

    def _context(
        self, user_message: str, *, probe: bool, raw: bool = True
    ) -> tuple[list[Message], list[str]]:
        """The request for `user_message` and the memories placed in it.

        `raw=False` (a memory-only probe) leaves out messages held raw and not yet written.
        """
        raise NotImplementedError

    def _remember(self, user_message: str, assistant_message: str) -> None:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _restore(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _save_extra(self, directory: Path) -> None:
        pass

    def _load_extra(self, directory: Path) -> None:
        pass

    def _fresh(self, prompts: dict[str, str]) -> BasePolicy:
        return type(self)(self.config, self.client, self.workdir)

    def _merge_prompts(self, prompts: dict[str, str]) -> dict[str, str]:
        current = self.prompts()
        unknown = sorted(set(prompts) - set(current))
        if unknown:
            allowed = ", ".join(current) or "none: this policy has no memory-write prompts"
            raise UserError(
                f"policy {self.name}: unknown prompt {unknown[0]!r} (allowed: {allowed})"
            )
        for key, text in prompts.items():
            if not isinstance(text, str) or not text.strip():
                raise UserError(f"policy {self.name}: prompt {key!r} must be non-empty text")
        return {**current, **prompts}


class BufferedMemoryPolicy(BasePolicy):
    """A policy that buffers turns and writes them to memory in batches (AWI, AWE, RAG).

    A subclass sets ``self.buffer`` (a :class:`MessageBuffer`) and supplies ``_write`` (store one
    due batch); the memory it places in context goes through :meth:`_memory_messages`.
    """

    buffer: MessageBuffer

    def _remember(self, user_message: str, assistant_message: str) -> None:
        self.buffer.append("user", user_message, self.sim_time)
        self.buffer.append("assistant", assistant_message, self.sim_time)
        for batch, time in self.buffer.due_batches():
            self._write(batch, time)

    def _write(self, batch: list[Message], time: str | None) -> None:
        raise NotImplementedError

    def unwritten_messages(self) -> int:
        return len(self.buffer.messages)

    def _memory_messages(
        self, user_message: str, header: str, lines: list[str], empty: str, *, raw: bool = True
    ) -> list[Message]:
        """System prompt with ``lines`` under ``header`` (``empty`` if none), buffer, message.

        `raw=False` leaves the buffer (messages not yet written) out: the request then holds
        written memory only.
        """
        listing = "\n".join(f"- {line}" for line in lines) if lines else empty
        return [
            {"role": "system", "content": f"{ASSISTANT_INTRO}\n\n{header}:\n{listing}"},
            *(self.buffer.messages if raw else []),
            {"role": "user", "content": user_message},
        ]
