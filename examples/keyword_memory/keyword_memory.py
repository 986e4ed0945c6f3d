"""A keyword-store memory: about the smallest policy memloop can evaluate.

Written as docs/memory-system.md describes plug-in policies.
"""

import json
import re
from pathlib import Path

from memloop.policies import Answer

WORD = re.compile(r"[a-z0-9]{3,}")


class KeywordMemory:
    """Keeps every user message; puts the `top_k` sharing most words with a message in context."""

    name = "keyword-memory"

    def __init__(self, options, client, workdir):
        self.options, self.client, self.workdir = options, client, workdir
        self.top_k = int(options.get("top_k", 3))
        self.max_tokens = options.get("max_tokens")  # reply cap (None: the endpoint's)
        self.notes = []

    def _ask(self, text, schema=None):
        words = set(WORD.findall(text.lower()))
        ranked = sorted(self.notes, key=lambda n: -len(words & set(WORD.findall(n.lower()))))
        memories = ranked[: self.top_k]
        system = "You are a personal assistant. The user told you:\n" + "\n".join(memories)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        if schema is None:
            reply = self.client.chat(messages, component="agent", max_tokens=self.max_tokens)
            return Answer(reply.text, memories)
        result = self.client.chat_json(messages, schema, component="probe")
        return Answer(result.text, memories, result.parsed, result.json_error)

    def respond(self, user_message):
        reply = self._ask(user_message).text
        self.ingest(user_message, reply)
        return reply

    def ingest(self, user_message, assistant_message):
        self.notes.append(user_message)

    def answer(self, prompt, *, schema=None, memory_only=False):
        return self._ask(prompt, schema)  # the notes are all it has: nothing is held unwritten

    def memory_view(self):
        return "\n".join(self.notes)

    def unwritten_messages(self):
        return 0

    def prompts(self):
        return {}  # nothing for an evolver to rewrite

    def with_prompts(self, prompts, *, keep_memory=False):
        if prompts:
            raise KeyError(f"KeywordMemory has no prompts named {sorted(prompts)}")
        twin = KeywordMemory(self.options, self.client, self.workdir)
        twin.notes = list(self.notes) if keep_memory else []
        return twin

    def save(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "notes.json").write_text(json.dumps(self.notes))

    def load(self, directory):
        self.notes = json.loads((Path(directory) / "notes.json").read_text())
        return self

    def close(self):
        pass
