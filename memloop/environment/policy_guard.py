"""Every return of a policy checked where an episode uses it, so a plug-in's bug is named.

`memloop policy check` (environment/policy_check.py) tries a policy once on a scripted
conversation; this guard checks each return during eval and evolve, where a plug-in's `respond`
returning an int or its `answer` returning a dict would otherwise fail far from its cause (a
pydantic error while saving a record, an AttributeError while scoring). The error names the
plug-in, the method, what it returned, the user and the period, and points at `policy check`.
A plug-in method that raises is one line too (`core.plugins.call`): the plug-in, the method, the
exception, the user and the period, and the plug-in's line it was raised at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from memloop.core.errors import UserError
from memloop.core.plugins import accepts_keyword, call, checked_prompts, plugin_label
from memloop.llm.client import schema_problem


def _described(value: Any) -> str:
    return "None" if value is None else type(value).__name__


class GuardedPolicy:
    """A policy (environment.policy.Policy) whose every return is checked for its type.

    `period` is set by the episode runner before each period (None: before any); everything not
    checked here is passed through to the policy.
    """

    def __init__(self, policy: Any, user_id: str, period: int | None = None):
        self.inner = policy
        self.user_id = user_id
        self.period = period

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def label(self) -> str:
        return plugin_label(self.inner)

    @property
    def where(self) -> str:
        """` for user U, period P` (no period before the first)."""
        period = "" if self.period is None else f", period {self.period}"
        return f" for user {self.user_id}{period}"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The policy's `method`; a plug-in's exception is one line naming the user and period."""
        return call(self.inner, method, *args, where=self.where, **kwargs)

    def _bad(self, method: str, returned: str) -> NoReturn:
        raise UserError(
            f"plug-in {self.label}.{method} returned {returned}{self.where}: run memloop policy "
            "check"
        )

    def respond(self, user_message: str) -> str:
        reply = self._call("respond", user_message)
        if not isinstance(reply, str):
            self._bad("respond", _described(reply))
        return reply

    def ingest(self, user_message: str, assistant_message: str) -> None:
        self._call("ingest", user_message, assistant_message)

    def answer(
        self,
        prompt: str,
        *,
        schema: dict[str, Any] | None = None,
        memory_only: bool = False,
        top_logprobs: int | None = None,
    ) -> Any:
        extra: dict[str, Any] = {}
        if top_logprobs and accepts_keyword(self.inner.answer, "top_logprobs"):
            extra["top_logprobs"] = top_logprobs  # a plug-in without it answers without them
        answer = self._call("answer", prompt, schema=schema, memory_only=memory_only, **extra)
        if not isinstance(getattr(answer, "text", None), str):
            self._bad("answer", f"{_described(answer)} (no text str)")
        memories = getattr(answer, "retrieved_memories", None)
        if not isinstance(memories, list) or not all(isinstance(m, str) for m in memories):
            self._bad("answer", f"retrieved_memories {_described(memories)} (not a list of str)")
        if schema is not None:
            parsed, error = getattr(answer, "parsed", None), getattr(answer, "json_error", None)
            if (parsed is None) == (error is None):
                self._bad("answer", "both or neither of parsed and json_error with a schema")
            if parsed is not None:
                problem = schema_problem(parsed, schema)
                if problem:
                    self._bad(
                        "answer", f"parsed that breaks the question's schema ({problem[:120]})"
                    )
        return answer

    def memory_view(self) -> str:
        view = self._call("memory_view")
        if not isinstance(view, str):
            self._bad("memory_view", _described(view))
        return view

    def unwritten_messages(self) -> int:
        count = self._call("unwritten_messages")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            self._bad("unwritten_messages", f"{count!r:.40} (not a count)")
        return count

    def prompts(self) -> dict[str, str]:
        return checked_prompts(self.inner, self.where)

    def with_prompts(self, prompts: dict[str, str], *, keep_memory: bool = False) -> GuardedPolicy:
        made = self._call("with_prompts", prompts, keep_memory=keep_memory)
        if made is None or not hasattr(made, "respond"):
            self._bad("with_prompts", _described(made))
        return GuardedPolicy(made, self.user_id, self.period)

    def load(self, directory: Path) -> GuardedPolicy:
        self._call("load", directory)  # into the policy itself (the contract returns self)
        return self

    def save(self, directory: Path) -> None:
        self._call("save", directory)

    def close(self) -> None:
        self._call("close")


def guarded(policy: Any, user_id: str) -> GuardedPolicy:
    """`policy` under a GuardedPolicy (once: an already guarded policy is returned as it is)."""
    return policy if isinstance(policy, GuardedPolicy) else GuardedPolicy(policy, user_id)
