"""A scriptable stand-in for the model behind the policies, for tests without a real LLM.

Give it to :class:`memloop.testing.FakeOpenAIServer` as ``reply=``. It tells the policies'
requests apart (chat reply, probe, AWI writer, mem0 fact extraction, mem0 reconciliation, mem0's
graph tool calls) and answers each with the handler given for it; every request is also logged by
kind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing.fake_server import request_schema

Handler = Callable[[str, dict[str, Any]], Any]  # (text of the request, request body) -> answer


def _text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in body.get("messages", []))


def request_kind(body: dict[str, Any]) -> str:
    """'writer', 'facts', 'actions', 'tools', 'probe' (any other schema) or 'chat' (no schema).

    mem0's own requests (an exported config that mem0 runs with its OpenAI client, not memloop's)
    carry no schema, only ``response_format: json_object``: extraction is a system prompt then
    ``Input:``, reconciliation the prompt listing the new retrieved facts.
    """
    schema = request_schema(body) or {}
    properties = schema.get("properties") or {}
    if not schema and (body.get("response_format") or {}).get("type") == "json_object":
        messages = body.get("messages") or [{}]
        if messages[0].get("role") == "system" and conversation_of(body).startswith("Input:"):
            return "facts"
        if "new retrieved facts" in conversation_of(body):
            return "actions"
    if "edits" in properties:
        return "writer"
    if set(properties) == {"facts"}:
        return "facts"
    if set(properties) == {"memory"}:
        return "actions"
    if set(properties) == {"calls"}:
        return "tools"
    return "probe" if body.get("response_format") else "chat"


class ScriptedMemoryLLM:
    """Callable reply function.

    Handlers return a str (sent as is) or a JSON-able value: `writer` -> list of {label, value}
    edits, `facts` -> list of str, `actions` -> list of {id, text, event, old_memory}, `tools` ->
    the list of calls (see `called_functions`), `probe` -> any JSON value, `chat` -> str.
    """

    def __init__(
        self,
        *,
        chat: Handler | str = "Noted, thanks for telling me.",
        writer: Handler | None = None,
        facts: Handler | None = None,
        actions: Handler | None = None,
        tools: Handler | None = None,
        probe: Handler | None = None,
    ):
        self.handlers: dict[str, Handler | str | None] = {
            "chat": chat,
            "writer": writer,
            "facts": facts,
            "actions": actions,
            "tools": tools,
            "probe": probe,
        }
        self.log: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, body: dict[str, Any]) -> str:
        kind = request_kind(body)
        self.log.append((kind, body))
        handler = self.handlers.get(kind)
        text = _text(body)
        if isinstance(handler, str):
            return handler
        value = handler(text, body) if handler is not None else None
        if isinstance(value, str):
            return value
        if kind == "writer":
            return json.dumps({"edits": value or []})
        if kind == "facts":
            return json.dumps({"facts": value or []})
        if kind == "actions":
            return json.dumps({"memory": value or []})
        if kind == "tools":
            return json.dumps({"calls": value or []})
        if kind == "probe":
            return json.dumps(value if value is not None else {"answer": 1})
        return "ok"

    def requests(self, kind: str) -> list[dict[str, Any]]:
        return [body for k, body in self.log if k == kind]


def called_functions(body: dict[str, Any]) -> list[str]:
    """The functions a tool-call request (kind 'tools') offers, as its system message lists them."""
    system = str((body.get("messages") or [{}])[0].get("content", ""))
    listed = system.rsplit("Functions you can call:", 1)[-1]
    return re.findall(r"^- (\w+):", listed, re.M)


def conversation_of(body: dict[str, Any]) -> str:
    """The conversation excerpt a memory-write request carries (its last user message)."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if users else ""


# -- one scripted user, shared by the mem0 tests: a city that changes, and the cello ------------


def facts_of(text: str, body: dict[str, Any]) -> list[str]:
    """Extract like a careful model: where the user lives (Lisbon or Oslo), and the cello."""
    excerpt = conversation_of(body)
    facts = []
    for city in ("Lisbon", "Oslo"):
        if f"I live in {city}" in excerpt or f"moved to {city}" in excerpt:
            facts.append(f"Lives in {city}")
    if "cello" in excerpt:
        facts.append("Plays the cello")
    return facts


def actions_of(text: str, body: dict[str, Any]) -> list[dict[str, str]]:
    """Reconcile like a careful model: a new city replaces the old one, anything else is added."""
    prompt = conversation_of(body)
    existing = dict(re.findall(r"'id': '(\d+)', 'text': '([^']*)'", prompt))
    facts_part = prompt.split("new retrieved facts", 1)[1]
    listed = re.search(r"```\n\s*(\[.*?\])\n\s*```", facts_part, re.S)
    assert listed is not None, "no list of new facts in the reconciliation prompt"
    new = json.loads(listed.group(1).replace("'", '"'))
    actions = []
    for fact in new:
        old = next((i for i, t in existing.items() if t.startswith("Lives in")), None)
        if fact.startswith("Lives in") and old is not None:
            actions.append(
                {"id": old, "text": fact, "event": "UPDATE", "old_memory": existing[old]}
            )
        elif fact in existing.values():
            continue
        else:
            actions.append({"id": "new", "text": fact, "event": "ADD", "old_memory": ""})
    return actions


def loopback_client(server: Any, folder: Path) -> ChatClient:
    """A ChatClient on a fake server (`FakeOpenAIServer`), its response cache under `folder`."""
    return ChatClient(Endpoint(model="m", base_url=server.base_url), cache=folder / "c.sqlite")
