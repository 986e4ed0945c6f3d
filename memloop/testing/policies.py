"""A scripted policy: a complete, deterministic Policy with no model behind it.

It remembers every user message verbatim, replies by echoing, and answers probes by rule: the
multiple-choice question (a schema with an ``answer`` property) gets option ``choice``, a state
query gets the first allowed value of every variable, any other schema gets ``"unknown"`` for every
string property; a lettered question asked with ``top_logprobs`` gets the option sharing most
words with what the user said, with log-probabilities (``letter_answer``). It passes
:func:`memloop.environment.policy_check.check_policy` and drives the episode runner, the scorer
and the optimizer loop in tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json
from memloop.policies.base import Answer

DEFAULT_PROMPTS = {"writer": "Remember what the user says."}


class ScriptedPolicy:
    """Echoing memory, rule-based probe answers, one or more mutable prompts.

    Args:
        prompts: the mutable prompts (default: one ``writer`` prompt).
        choice: the option number picked for multiple-choice questions.
        garble_every: when > 0, every n-th multiple-choice answer is not JSON (``json_error``).
        delay_s: seconds to sleep in :meth:`respond` (to test interruption and concurrency).
    """

    name = "scripted"

    def __init__(
        self,
        prompts: dict[str, str] | None = None,
        *,
        choice: int = 1,
        garble_every: int = 0,
        delay_s: float = 0.0,
    ) -> None:
        self._prompts = dict(DEFAULT_PROMPTS if prompts is None else prompts)
        self.choice = choice
        self.garble_every = garble_every
        self.delay_s = delay_s
        self.seen: list[str] = []
        self.respond_calls = 0
        self.mc_answers = 0
        self.closed = False

    # -- conversation ---------------------------------------------------------------------

    def respond(self, user_message: str) -> str:
        self.respond_calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        self.seen.append(user_message)
        return f"echo: {user_message[-40:]}"

    def ingest(self, user_message: str, assistant_message: str) -> None:
        self.seen.append(user_message)

    # -- probes ---------------------------------------------------------------------------

    def answer(
        self,
        prompt: str,
        *,
        schema: dict[str, Any] | None = None,
        memory_only: bool = False,
        top_logprobs: int | None = None,
    ) -> Answer:
        memories = self.seen[-3:]
        if top_logprobs:
            return letter_answer(prompt, self.seen, list(memories))
        if schema is None:
            return Answer(f"From memory: {' | '.join(memories)}", list(memories))
        props = schema.get("properties", {})
        if "answer" in props:
            self.mc_answers += 1
            if self.garble_every and self.mc_answers % self.garble_every == 0:
                return Answer("oops", list(memories), None, "not JSON: Expecting value")
            value: dict[str, Any] = {"answer": self.choice}
        else:
            value = {
                key: (spec["enum"][0] if "enum" in spec else "unknown")
                for key, spec in props.items()
            }
        return Answer(json.dumps(value), list(memories), value)

    def memory_view(self) -> str:
        return "\n".join(self.seen)

    def unwritten_messages(self) -> int:
        return 0  # everything taken in is memory

    # -- prompts --------------------------------------------------------------------------

    def prompts(self) -> dict[str, str]:
        return dict(self._prompts)

    def with_prompts(self, prompts: dict[str, str], *, keep_memory: bool = False) -> ScriptedPolicy:
        unknown = sorted(set(prompts) - set(self._prompts))
        if unknown:
            raise UserError(f"policy {self.name}: unknown prompt {unknown[0]!r}")
        twin = ScriptedPolicy(
            {**self._prompts, **prompts},
            choice=self.choice,
            garble_every=self.garble_every,
            delay_s=self.delay_s,
        )
        if keep_memory:
            twin.seen = list(self.seen)
        return twin

    # -- checkpoints ----------------------------------------------------------------------

    def save(self, directory: Path | str) -> None:
        state = {"seen": self.seen, "prompts": self._prompts, "mc_answers": self.mc_answers}
        atomic_write_json(Path(directory) / "scripted.json", state)

    def load(self, directory: Path | str) -> ScriptedPolicy:
        state = json.loads((Path(directory) / "scripted.json").read_text(encoding="utf-8"))
        self.seen = list(state["seen"])
        self._prompts = dict(state["prompts"])
        self.mc_answers = int(state["mc_answers"])
        return self

    def close(self) -> None:
        self.closed = True


def letter_answer(prompt: str, seen: list[str], memories: list[str]) -> Answer:
    """A one-token answer to a lettered question, with its top log-probabilities.

    The option sharing most words with what the user said gets probability 0.7, the others share
    0.3 (the first of equals wins); the letter read of the state queries (feedback/probes.py).
    """
    import math
    import re

    options = re.findall(r"^([A-Z])\. (.+)$", prompt, flags=re.M)
    if not options:
        return Answer("A", memories, None, None, [("A", 0.0)])
    said = {w for m in seen for w in m.lower().split() if len(w) > 3}
    best = max(
        range(len(options)), key=lambda i: (sum(w in said for w in options[i][1].split()), -i)
    )
    rest = math.log(0.3 / max(1, len(options) - 1))
    top = [(letter, math.log(0.7) if i == best else rest) for i, (letter, _) in enumerate(options)]
    return Answer(options[best][0], memories, None, None, top)


def scripted_builder(**policy_options: Any) -> Callable[..., ScriptedPolicy]:
    """A ``build_policy``-shaped factory ``(config, client, workdir, prompts=None)``.

    It ignores the config, client and workdir and builds a ScriptedPolicy with
    ``policy_options`` (e.g. ``garble_every=3``), using ``prompts`` when given.
    """

    def build(
        config: Any, client: Any, workdir: Any, prompts: dict[str, str] | None = None
    ) -> ScriptedPolicy:
        policy = ScriptedPolicy(**policy_options)
        return policy.with_prompts(prompts) if prompts else policy

    return build


def refused_in_one_line(tmp_path: Path, policy_yaml: str, message: str) -> None:
    """Loading `policy_yaml` fails with one line: the file, then `message`.

    The file is written under `tmp_path`; an AssertionError says what was wrong.
    """
    from memloop.policies import load_policy_config

    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml)
    try:
        load_policy_config(path)
    except UserError as exc:
        text = str(exc)
    else:
        raise AssertionError(f"{path} was accepted; expected: {message}")
    assert text.startswith(f"{path}: {message}"), text
    assert "\n" not in text, text
