"""The simulated user (paper §3.2).

It opens each session with its pre-generated utterance and the session time, then keeps the
conversation going for the configured rounds while role-playing the profile and never stating values
of schema variables beyond the session's exposed ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memloop.environment.data import Session, UserItem
from memloop.llm.client import ChatClient

SIM_SYSTEM = """You play a human user who is chatting with an AI assistant. Stay in character:
write only the user's next message, in the first person, as plain text (1-3 sentences), with no
labels, quotes or stage directions.

Who you are:
{profile}

Today is {today}. You opened this conversation with:
"{opening}"

Keep the conversation going naturally: react to the assistant's last reply, ask a follow-up about
details, options or related practical concerns, or answer its clarifying question in general terms.
Do not repeat your opening message and do not greet again.

Private facts you must NOT reveal, hint at or confirm in this conversation (if the assistant asks
about them, deflect politely or say you would rather not go into it):
{hidden}
{shared}"""


@dataclass
class SimulatorConfig:
    rounds_init: int = 1  # user/assistant rounds per session in period 0
    rounds_update: int = 2  # rounds per session in later periods
    leak_retries: int = 2  # fresh draws when a follow-up names a hidden value
    temperature: float | None = None  # None: the endpoint's


@dataclass
class FollowUp:
    text: str
    leaked_variables: list[str] = field(default_factory=list)  # hidden values still named


def opening_message(session: Session) -> str:
    """The session's first user turn: the simulated time, then the pre-generated utterance."""
    return f"[Current Time: {session.session_time}]\n{session.query}"


def _value_pattern(value: str) -> re.Pattern[str] | None:
    words = value.replace("_", " ").replace("-", " ").strip().lower()
    if len(words) < 5:  # short values ("yes", "none") would match everywhere
        return None
    return re.compile(r"\b" + r"[\s_-]+".join(map(re.escape, words.split())) + r"\b")


def hidden_values_named(
    text: str, item: UserItem, period: int, exposed: dict[str, str]
) -> list[str]:
    """Variables outside `exposed` whose current value is named verbatim in `text`."""
    lowered = text.lower()
    state = item.state_at(period)
    named = []
    for variable, value in sorted(state.items()):
        if variable in exposed:
            continue
        pattern = _value_pattern(value)
        if pattern is not None and pattern.search(lowered):
            named.append(variable)
    return named


class UserSimulator:
    """Follow-up turns for one user, through the shared chat client (component `user_sim`)."""

    def __init__(self, client: ChatClient, config: SimulatorConfig | None = None):
        self.client = client
        self.config = config or SimulatorConfig()

    def rounds(self, period: int) -> int:
        return self.config.rounds_init if period == 0 else self.config.rounds_update

    def follow_up(
        self, item: UserItem, period: int, session: Session, history: list[dict[str, str]]
    ) -> FollowUp:
        """The user's next message after `history`.

        `history` is the session so far, ending with the assistant's reply. Only the last exchange
        is shown, as in the paper.
        """
        hidden = {v: c for v, c in item.state_schema.items() if v not in session.exposed_states}
        hidden_lines = (
            "\n".join(
                f"- {v.replace('_', ' ')} (any of: {', '.join(c)})"
                for v, c in sorted(hidden.items())
            )
            or "- (none)"
        )
        shared = ""
        if session.exposed_states:
            shared = (
                "\nYou may stay consistent with what you already said about: "
                + ", ".join(sorted(v.replace("_", " ") for v in session.exposed_states))
                + "."
            )
        system = SIM_SYSTEM.format(
            profile=item.user_profile.text(),
            today=session.session_time,
            opening=session.query,
            hidden=hidden_lines,
            shared=shared,
        )
        recent = history[-2:]
        transcript = "\n".join(
            f"{'You' if m['role'] == 'user' else 'Assistant'}: {_clean(m['content'])}"
            for m in recent
        )
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{transcript}\n\nWrite your next message."},
        ]
        text, leaked = "", []
        for attempt in range(self.config.leak_retries + 1):
            result = self.client.chat(
                messages, component="user_sim", sample=attempt, temperature=self.config.temperature
            )
            text = _clean(result.text)
            leaked = hidden_values_named(text, item, period, session.exposed_states)
            if not leaked and text:
                break
        return FollowUp(text or "Thanks, that helps. Anything else I should keep in mind?", leaked)


_TIME_PREFIX = re.compile(r"^\s*\[current time:[^\]]*\]\s*", re.IGNORECASE)


def _clean(text: str) -> str:
    """Drop a copied time stamp, a speaker label and wrapping quotes the model may add."""
    text = _TIME_PREFIX.sub("", text.strip())
    text = re.sub(r"^(user|you|me)\s*:\s*", "", text, flags=re.IGNORECASE)
    return text.strip().strip('"').strip()
