"""A scripted evolver: deterministic, model-free proposals for tests of the optimizer loop."""

from __future__ import annotations

import json
import re
from typing import Any

from memloop.optimize.contract import EvolveInput, EvolveStep, NoSettings
from memloop.testing.checker import is_recall_request, notes_checker
from memloop.testing.fake_server import request_schema


class ScriptedEvolver:
    """Appends ``rule`` (with the cycle number) to every prompt; passes ``check_evolver``."""

    name = "scripted"
    Settings = NoSettings

    def __init__(
        self,
        client: Any = None,
        settings: NoSettings | None = None,
        rule: str = "Keep each stored fact current.",
    ) -> None:
        self.settings = settings or NoSettings()
        self.rule = rule

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        line = f"{self.rule} (cycle {inputs.cycle})"
        return EvolveStep(
            prompts={k: f"{v}\n{line}" for k, v in inputs.prompts.items()},
            changes={k: [f"added: {line}"] for k in inputs.prompts},
        )


def is_evolver_request(body: dict[str, Any]) -> bool:
    """A chat request from the reflective evolver (or GEPA's reflection step)."""
    text = " ".join(str(m.get("content", "")) for m in body["messages"])
    return "<new_instructions>" in text or "``` blocks" in text


def seeded_pick(prompt: str, seed: int) -> int:
    """An option number of a multiple-choice prompt drawn from `seed` (2 when none is listed)."""
    import hashlib
    import re

    options = re.findall(r"^(\d+)\. ", prompt, flags=re.M)
    if not options:
        return 2
    digest = hashlib.sha256(f"{seed}\n{prompt}".encode()).digest()
    return int(options[digest[0] % len(options)])


def informed_pick(prompt: str) -> int:
    """The option number a fake model picks for a multiple-choice prompt.

    2, unless the prompt lists the user's current situation ("- variable: value" lines, as the
    upper bound's prompt does): then the option naming most of those values' words.
    """
    import re

    if "current situation:" not in prompt:
        return 2
    facts = re.findall(r"^- [^:\n]+: (.+)$", prompt, flags=re.M)
    words = {w for value in facts for w in value.lower().split() if len(w) > 2}
    options = re.findall(r"^(\d+)\. (.+)$", prompt, flags=re.M)
    if not words or not options:
        return 2
    best = max(options, key=lambda o: sum(w in o[1].lower() for w in words))
    return int(best[0])


def evolve_loop_reply(body: dict[str, Any]) -> str:
    """A FakeOpenAIServer reply for the whole evolution loop, deterministic per request.

    Evolver requests get a rewrite (as `<new_instructions>`, or in a ``` block for GEPA) that
    differs with the amount of feedback; schema requests get schema-valid JSON (answer 2, or, when
    the prompt states the user's situation as for the upper bound, the option sharing the most
    words with it; a factual-recall check is answered from its notes (`notes_checker`: "yes"
    when the claimed value is in them), so the checker passes its calibration; every other field
    "yes"); plain chat gets a short user-like line.

    A sampled request (one that carries a `seed`: temperature > 0) answers a question the upper
    bound did not inform with an option drawn from the seed and the prompt, so draws of a run
    (evolve's `repeats:`) differ and each replays exactly.
    """
    schema = request_schema(body)
    if is_evolver_request(body):
        n = sum(1 for m in body["messages"] if "feedback" in str(m.get("content", "")).lower())
        text = (
            "Record every stated fact about the user's current situation and update stale "
            f"ones (v{n})."
        )
        if "``` blocks" in " ".join(str(m.get("content", "")) for m in body["messages"]):
            return f"```\n{text}\n```"
        return (
            "<changes>\n- focus on current situation\n</changes>\n"
            f"<new_instructions>\n{text}\n</new_instructions>"
        )
    if schema is None:
        return "Interesting, tell me more."
    props = schema["properties"]
    if set(props) == {"op", "id", "rule"}:  # the playbook evolver's one delta
        n = str(body["messages"][-1].get("content", "")).count("] helpful ")
        return json.dumps(
            {"op": "ADD", "id": "new", "rule": f"Keep kind {n + 1} of the user's facts current."}
        )
    if "answer" in props:
        prompt = str(body["messages"][-1].get("content", ""))
        if "seed" in body and "current situation:" not in prompt:
            return json.dumps({"answer": seeded_pick(prompt, int(body["seed"]))})
        return json.dumps({"answer": informed_pick(prompt)})
    if is_recall_request(body):
        return notes_checker(body)
    return json.dumps({k: "yes" for k in props})


_TIME_TAG = re.compile(r"\[Current Time:[^\]]*\]\s*")


def _untagged(said: str) -> str:
    """A user's words without the "[Current Time: ...]" stamp, whitespace collapsed."""
    return " ".join(_TIME_TAG.sub("", said).split())


def writing_reply(body: dict[str, Any]) -> str:
    """`evolve_loop_reply`, except that an AWI writer request stores what the user last said.

    The edit is `said_about_<first word>` with the user's last sentence as its value (time tag
    removed), so memory fills from the conversation and a trace shows real edits.
    """
    if "edits" not in (request_schema(body) or {}).get("properties", {}):
        return evolve_loop_reply(body)
    text = str(body["messages"][-1].get("content", ""))
    users = re.findall(r"(?ms)^user: (.*?)(?=^assistant: |^\[\[ ## |\Z)", text)
    said = _untagged(users[-1] if users else "")
    if not said:
        return json.dumps({"edits": []})
    word = re.sub(r"[^a-z]", "", said.split()[0].lower()) or "fact"
    return json.dumps({"edits": [{"label": f"said_about_{word}", "value": said[:120]}]})


def awe_writing_reply(body: dict[str, Any]) -> str:
    """`evolve_loop_reply`, except that AWE's memory holds the user's words and is read back.

    mem0's extraction answers each line the user said in the excerpt (time tag removed) as a
    fact, its reconciliation adds every new fact: alike whether the request carries memloop's
    schema or only mem0's own ``json_object`` (an exported config run by mem0: `request_kind`),
    so the two runtimes store the same memories. A multiple-choice question is answered with the
    option sharing most words with the memories its system message lists (2 without any), so
    what memory holds moves the score.
    """
    import ast

    from memloop.testing.scripted_llm import conversation_of, request_kind

    kind = request_kind(body)
    if kind == "facts":
        said = re.findall(r"(?m)^user: (.*)$", conversation_of(body))
        facts = [_untagged(s) for s in said]
        return json.dumps({"facts": [f[:200] for f in dict.fromkeys(facts) if f]})
    if kind == "actions":
        listed = re.findall(r"```\s*(\[.*?\])\s*```", conversation_of(body), re.S)
        new = ast.literal_eval(listed[-1]) if listed else []
        actions = [{"id": "new", "text": f, "event": "ADD", "old_memory": ""} for f in new]
        return json.dumps({"memory": actions})
    props = (request_schema(body) or {}).get("properties", {})
    messages = body.get("messages") or [{}]
    if "answer" in props and messages[0].get("role") == "system" and "seed" not in body:
        remembered = re.findall(r"(?m)^- (.+)$", str(messages[0].get("content", "")))
        words = {w for line in remembered for w in re.findall(r"[a-z]{4,}", line.lower())}
        options = re.findall(r"(?m)^(\d+)\. (.+)$", str(messages[-1].get("content", "")))
        if words and options:
            best = max(options, key=lambda o: sum(w in o[1].lower() for w in words))
            return json.dumps({"answer": int(best[0])})
    return evolve_loop_reply(body)


def scripted_screen(values: list[dict[str, float]]) -> tuple[Any, list[str]]:
    """(a replay screen, the `writer` prompts it saw): call i answers {user: score} values[i].

    The current prompt is screened first, then each candidate; past the list the last answer
    repeats; `screen(prompts, users=n)` answers the first n users of the call's values. Each
    answer is a `replay_score.Screening` of 100 tokens, without letter reads.
    """
    from memloop.optimize.replay_score import Screening

    seen: list[str] = []

    def screen(prompts: dict[str, str], users: int | None = None) -> Any:
        seen.append(prompts["writer"])
        by_user = values[min(len(seen), len(values)) - 1]
        if users:  # the first `users` users, as the episode search's screen
            by_user = dict(list(by_user.items())[:users])
        return Screening(
            state_accuracy=sum(by_user.values()) / len(by_user),
            pairs=len(by_user),
            tokens=100,
            requests=0,
            by_user=dict[str, float | None](by_user),
        )

    return screen, seen


# the source of a module holding an empty search class `Mine` (name "mine"): a plug-in that tests
# write to a file, or to a package with an entry point, to resolve by every name form
EMPTY_SEARCH_MODULE = """
from memloop.optimize.contract import NoSettings


class Mine:
    name = "mine"
    Settings = NoSettings
    needs_val = False
    evolves_itself = False

    def __init__(self, settings=None):
        self.settings = settings or NoSettings()

    def cycles(self, ctx):
        yield from ()
"""
