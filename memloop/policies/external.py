"""External memory through mem0ai 1.x: the AWE and RAG policies.

AWE does LLM fact extraction + ADD/UPDATE/DELETE reconciliation, RAG stores raw messages (no LLM
write); both retrieve the top-k memories for the user's message and show them, with the newest
raw messages, in context.

mem0's own LLM and embedder are replaced after construction: its LLM calls go through the shared
ChatClient (tag "memory": cached, counted, bounded, schema-constrained) and embeddings come from
one SentenceTransformer per process. The vector store is an in-memory Qdrant per policy, or the
mem0 store the config's `vector_store:` names (policies/mem0_options.py: a local one in the
private folder, a server one as a collection of its own); the mem0 history log is a sqlite file
in a private folder under the workdir. A checkpoint stores the memories with their vectors (a
store whose listing has no vectors gets them from the embedder, which gives the vector mem0
stored: mem0 embeds exactly the text it stores), so loading needs no LLM call.

`AWEPolicy.deployed(config, ...)` is the other way round: mem0 as an exported config deploys it
(`memloop export --format mem0`), built by mem0's own `Memory.from_config` with its own OpenAI
LLM client, embedder and store, nothing replaced; `memloop export --check` scores it so.
"""

from __future__ import annotations

import copy
import logging
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from memloop.core.settings import apply_offline_defaults, import_keeping_warning_filters

apply_offline_defaults()  # mem0 reads MEM0_TELEMETRY / MEM0_DIR when it is imported
import_keeping_warning_filters("mem0")  # its import would turn DeprecationWarnings on

from mem0 import Memory  # noqa: E402
from mem0.vector_stores.qdrant import Qdrant  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

from memloop.core.errors import UserError  # noqa: E402
from memloop.core.files import atomic_write_json  # noqa: E402
from memloop.llm.client import ChatClient, ChatResult  # noqa: E402
from memloop.policies.base import (  # noqa: E402
    BufferedMemoryPolicy,
    Message,
    MessageBuffer,
    read_json,
    simulated_time,
)
from memloop.policies.config import AWEConfig, RAGConfig  # noqa: E402
from memloop.policies.embedder import SharedEmbedder  # noqa: E402
from memloop.policies.mem0_graph import (  # noqa: E402
    GRAPH_FILE,
    close_graph,
    load_graph,
    relation_line,
    save_graph,
)
from memloop.policies.mem0_options import (  # noqa: E402
    COLLECTION,
    is_local,
    listed,
    mem0_graph_store,
    mem0_vector_store,
)
from memloop.policies.programs import AWEProgram, load_program, program_prompts, save_program  # noqa: E402
from memloop.policies.prompt_files import MEM0_KEYS  # noqa: E402

USER_ID = "user"
MEMORIES_FILE = "memories.json"
PROGRAM_FILE = "program.json"

# mem0 logs every memory operation at INFO and parse failures at ERROR; we count those ourselves.
logging.getLogger("mem0").setLevel(logging.CRITICAL)

# Bounds on the free text of mem0's answers: a small model caught in a repetition loop is closed
# inside valid JSON by a server that turns the schema into a grammar (llama.cpp), not cut at
# max_tokens. A fact or memory is one short statement; a turn states a few facts.
FACT_CHARS = 300
MAX_FACTS = 30
FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {"type": "string", "maxLength": FACT_CHARS},
            "maxItems": MAX_FACTS,
        }
    },
    "required": ["facts"],
    "additionalProperties": False,
}
_MEMORY_ID = re.compile(r"'id': '(\d+)'")


def memory_actions_schema(valid_ids: list[str]) -> dict[str, Any]:
    """The reconciliation answer mem0 parses.

    mem0 numbers the existing memories it shows 0..n-1 and silently drops an UPDATE or DELETE of
    any other id, so the ids are an enum ("new" for additions): a small model then cannot invent
    one. At most one action per memory shown and per new fact.
    """
    return {
        "type": "object",
        "properties": {
            "memory": {
                "type": "array",
                "maxItems": len(valid_ids) + MAX_FACTS,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "enum": [*valid_ids, "new"]},
                        "text": {"type": "string", "maxLength": FACT_CHARS},
                        "event": {"type": "string", "enum": ["ADD", "UPDATE", "DELETE", "NONE"]},
                        "old_memory": {"type": "string", "maxLength": FACT_CHARS},
                    },
                    "required": ["id", "text", "event", "old_memory"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["memory"],
        "additionalProperties": False,
    }


def tool_calls_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON answer that stands for calls of `tools` (OpenAI function tools): {"calls": [...]}.

    With one tool each call is that function's arguments; with several, {name, arguments}.
    """
    functions = [tool["function"] for tool in tools]
    if len(functions) == 1:
        items: dict[str, Any] = functions[0]["parameters"]
    else:
        items = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [f["name"]]},
                        "arguments": f["parameters"],
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for f in functions
            ]
        }
    return {
        "type": "object",
        "properties": {"calls": {"type": "array", "items": items}},
        "required": ["calls"],
        "additionalProperties": False,
    }


def tool_calls_instruction(tools: list[dict[str, Any]]) -> str:
    """What the tools' descriptions tell a model, for a request that answers in JSON instead."""
    functions = [tool["function"] for tool in tools]
    listed = "\n".join(f"- {f['name']}: {f.get('description', '').strip()}" for f in functions)
    shape = "its arguments" if len(functions) == 1 else '{"name": FUNCTION, "arguments": {...}}'
    return (
        f"\n\nFunctions you can call:\n{listed}\nCall them by answering with JSON "
        f'{{"calls": [...]}}, one element per call, each given as {shape}.'
    )


def with_tool_instruction(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` with the tools described at the end of the system message."""
    note = tool_calls_instruction(tools)
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0].get('content', '')}{note}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": note.strip()}, *messages]


def as_tool_calls(tools: list[dict[str, Any]], answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls of an answer to `tool_calls_schema(tools)`, as mem0 reads tool_calls."""
    functions = [tool["function"] for tool in tools]
    if len(functions) == 1:
        return [{"name": functions[0]["name"], "arguments": a} for a in answer["calls"]]
    return [{"name": c["name"], "arguments": c["arguments"]} for c in answer["calls"]]


class Mem0ChatLLM:
    """mem0's LLM interface over memloop's ChatClient.

    mem0 sends three kinds of request: fact extraction (a system prompt + 'Input: ...'),
    reconciliation (one user message) and, for graph memory, tool calls. Each gets a JSON schema,
    so even a small model answers in the shape mem0 parses. Tool calls are asked as a JSON answer
    (`tool_calls_schema`, with the tools described in the system message) rather than through the
    API's `tools`: every endpoint memloop talks to constrains JSON, not every one calls tools, and
    the answer is cached and counted like any other.
    """

    def __init__(self, client: ChatClient, component: str = "memory"):
        self.client = client
        self.component = component
        self.config = SimpleNamespace(model=client.endpoint.model)
        self.schema_failures = 0
        self._fatal: BaseException | None = None
        self._lock = threading.Lock()

    def generate_response(
        self,
        messages: list[dict[str, Any]],
        response_format: Any = None,
        tools: Any = None,
        tool_choice: str = "auto",
        **kwargs: Any,
    ) -> Any:
        if tools:
            return self._tool_calls(messages, list(tools))
        if messages and messages[0].get("role") == "system":
            schema = FACTS_SCHEMA
        elif response_format is not None:
            prompt = str(messages[-1].get("content", "")) if messages else ""
            ids = sorted(set(_MEMORY_ID.findall(prompt)), key=int)
            schema = memory_actions_schema(ids)
        else:
            schema = None
        return self._ask(messages, schema).text

    def _tool_calls(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        result = self._ask(with_tool_instruction(messages, tools), tool_calls_schema(tools))
        if not result.ok:
            return {"content": result.text, "tool_calls": []}
        return {"content": None, "tool_calls": as_tool_calls(tools, result.parsed)}

    def _ask(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None) -> ChatResult:
        try:
            result = self.client.chat(messages, component=self.component, schema=schema)
        except UserError as exc:
            # mem0 swallows exceptions of some calls (reconciliation, graph updates): keep it to
            # re-raise after add.
            with self._lock:
                self._fatal = exc
            raise
        if not result.ok:
            with self._lock:
                self.schema_failures += 1
        return result

    def take_fatal(self) -> BaseException | None:
        with self._lock:
            fatal, self._fatal = self._fatal, None
        return fatal


class _ExternalMemoryPolicy(BufferedMemoryPolicy):
    infer: ClassVar[bool]
    config: AWEConfig | RAGConfig

    def __init__(
        self,
        config,
        client: ChatClient,
        workdir: Path | str | None = None,
        prompts: dict[str, str] | None = None,
        *,
        mem0_config: dict[str, Any] | None = None,
    ):
        super().__init__(config, client, workdir)
        # a deployed mem0 config (`deployed`): its prompts are the config's, not `prompts`
        self._deployed = mem0_config
        if mem0_config is not None:
            prompts = {name: mem0_config[key] for name, key in MEM0_KEYS.items()}
        self.program = AWEProgram(**(prompts or {})) if self.infer else None
        self.buffer = MessageBuffer(config.update_freq, config.short_term_len)
        self.writes = 0
        self.read_errors = 0  # memory answers of retrievals (a graph's) that broke their schema
        self.events = {"ADD": 0, "UPDATE": 0, "DELETE": 0}
        self.embedder = SharedEmbedder(config.embedding_model)
        self.llm = Mem0ChatLLM(client, "memory")
        base = Path(workdir) if workdir is not None else None
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self._private_dir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=base))
        self._embedded: dict[str, list[float]] = {}  # text -> vector, for checkpoints
        option = config.vector_store
        # a server store's collection belongs to this instance alone: dropped at close
        self._drop_collection = option is not None and not is_local(option)
        try:
            if mem0_config is None:
                self.memory = self._open_mem0(option)
            else:
                self.memory = self._open_deployed(mem0_config)
        except BaseException:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            raise
        store = self.memory.vector_store
        # a Qdrant store (the default one included) lists its points with their vectors
        self._qdrant = store.client if isinstance(store, Qdrant) else None
        self.graph = self.memory.graph  # mem0's graph memory (AWE's graph_store:), or None
        if mem0_config is not None:
            return  # mem0 as deployed: its own LLM client and embedder
        self.memory.llm = self.llm
        self.memory.embedding_model = self.embedder
        if self.graph is not None:
            self.graph.llm = self.llm
            self.graph.embedding_model = self.embedder

    @classmethod
    def deployed(
        cls, config, client: ChatClient, workdir: Path | str | None, mem0_config: dict[str, Any]
    ) -> _ExternalMemoryPolicy:
        """The policy with mem0 built as `mem0_config` deploys it (an exported config).

        `mem0.Memory.from_config(mem0_config)`: its prompts, its OpenAI LLM client at the
        config's endpoint, its embedder and store; only where its files go changes (the local
        store's folder and the history file move into this policy's private folder, so users do
        not share them). The assistant's replies and the probes still go through `client`.
        """
        if not cls.infer:
            raise UserError(f"policy {cls.kind}: writes no prompt; a mem0 config deploys AWE")
        return cls(config, client, workdir, mem0_config=mem0_config)

    def _open_deployed(self, mem0_config: dict[str, Any]) -> Memory:
        local = copy.deepcopy(mem0_config)  # the caller's stays as exported
        local.pop("memloop_source", None)
        store = (local.get("vector_store") or {}).get("config") or {}
        if "path" in store:
            store["path"] = str(self._private_dir / "vector-store")
        local["history_db_path"] = str(self._private_dir / "mem0-history.sqlite")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "payload indexes have no effect in local Qdrant"
            return Memory.from_config(local)

    def adopt_program(self, program: Any) -> None:
        """Write with `program` (a loaded AWEProgram, e.g. `dspy.load`'s): mem0 sends it."""
        if self.program is None or self._deployed is not None:
            raise UserError(f"policy {self.kind}: has no program to replace")
        self.program = program
        self._sync_prompts()

    def _open_mem0(self, option: dict[str, Any] | None) -> Memory:
        """mem0 on the default in-process Qdrant, or on the store `option` names."""
        if option is None:
            vector_store: dict[str, Any] = {
                "provider": "qdrant",
                "config": {
                    "collection_name": COLLECTION,
                    "embedding_model_dims": self.embedder.dims,
                    "client": QdrantClient(location=":memory:"),
                },
            }
        else:
            vector_store = mem0_vector_store(
                option, dims=self.embedder.dims, folder=self._private_dir, kind=self.kind
            )
        mem0_config: dict[str, Any] = {
            "vector_store": vector_store,
            # Placeholders only: both are replaced below before any call is made.
            "llm": {
                "provider": "openai",
                "config": {
                    "model": "replaced-by-memloop",
                    "api_key": "unused",
                    "openai_base_url": "http://127.0.0.1:9/unused",
                },
            },
            "embedder": {
                "provider": "openai",
                "config": {
                    "model": "replaced-by-memloop",
                    "api_key": "unused",
                    "openai_base_url": "http://127.0.0.1:9/unused",
                    "embedding_dims": self.embedder.dims,
                },
            },
            "history_db_path": str(self._private_dir / "mem0-history.sqlite"),
            "version": "v1.1",
        }
        graph_option = getattr(self.config, "graph_store", None)
        if graph_option is not None:
            mem0_config["graph_store"] = mem0_graph_store(graph_option)
        if self.infer:
            prompts = self.prompts()
            mem0_config["custom_fact_extraction_prompt"] = prompts["fact_extraction"]
            mem0_config["custom_update_memory_prompt"] = prompts["memory_update"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "payload indexes have no effect in local Qdrant"
                return Memory.from_config(mem0_config)
        except Exception as exc:
            if option is None:
                raise
            # a server that does not answer, a folder that cannot be written: the user's to fix
            problem = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise UserError(
                f"vector_store: mem0's {option['provider']} store could not be opened: {problem}"
            ) from exc

    # -- prompts ------------------------------------------------------------------------------

    def prompts(self) -> dict[str, str]:
        return program_prompts(self.program) if self.program is not None else {}

    def _fresh(self, prompts: dict[str, str]) -> _ExternalMemoryPolicy:
        if self._deployed is not None:  # a deployed config's prompts are the config's
            return type(self)(self.config, self.client, self.workdir, mem0_config=self._deployed)
        return type(self)(self.config, self.client, self.workdir, prompts=prompts or None)

    def _sync_prompts(self) -> None:
        """Hand the program's instructions to mem0 (after a load replaced them)."""
        if self.program is None:
            return
        prompts = self.prompts()
        self.memory.config.custom_fact_extraction_prompt = prompts["fact_extraction"]
        self.memory.config.custom_update_memory_prompt = prompts["memory_update"]
        self.memory.custom_fact_extraction_prompt = prompts["fact_extraction"]
        self.memory.custom_update_memory_prompt = prompts["memory_update"]

    # -- reading ------------------------------------------------------------------------------

    def retrieve(self, query: str) -> list[str]:
        """The top-k memories for `query`, oldest write first, each as shown in context.

        With a graph, mem0's search also returns the graph relations of the entities in `query`
        (reranked by BM25): they follow the memories, one `source -- relation -- destination`
        line each.
        """
        failures = self.llm.schema_failures
        found = self.memory.search(query, user_id=USER_ID, limit=self.config.top_k)
        self.read_errors += self.llm.schema_failures - failures  # the graph's entity answers
        hits = found["results"]
        hits.sort(
            key=lambda h: (int((h.get("metadata") or {}).get("write_step") or 0), h["memory"])
        )
        lines = []
        for hit in hits:
            stamp = (hit.get("metadata") or {}).get("sim_time")
            text = hit["memory"]
            # A raw message that carries its own time tag needs no second one.
            lines.append(f"[{stamp}] {text}" if stamp and simulated_time(text) is None else text)
        lines.extend(relation_line(r) for r in found.get("relations") or [])
        return lines

    def _context(
        self, user_message: str, *, probe: bool, raw: bool = True
    ) -> tuple[list[Message], list[str]]:
        retrieved = self.retrieve(user_message)
        header = (
            "Memories about the user that may be relevant, oldest first "
            "(a [date] is when it was noted)"
        )
        messages = self._memory_messages(user_message, header, retrieved, "(none)", raw=raw)
        return messages, retrieved

    # -- writing ------------------------------------------------------------------------------

    def _write(self, batch: list[Message], time: str | None) -> None:
        metadata = {"write_step": self.writes + 1, "sim_time": time}
        result = self.memory.add(
            self._to_mem0(batch), user_id=USER_ID, metadata=metadata, infer=self.infer
        )
        fatal = self.llm.take_fatal()
        if fatal is not None:
            raise fatal
        self.writes += 1
        for item in result.get("results", []):
            if item.get("event") in self.events:
                self.events[item["event"]] += 1

    def _to_mem0(self, batch: list[Message]) -> list[Message]:
        return batch

    # -- views and state ----------------------------------------------------------------------

    def _points(self, with_vectors: bool) -> list[dict[str, Any]]:
        """Every stored memory as {id, payload, vector} (vector only when asked)."""
        if self._qdrant is None:
            entries: list[dict[str, Any]] = [
                {"id": str(e.id), "payload": dict(e.payload or {})}
                for e in listed(self.memory.vector_store)
            ]
            if with_vectors:
                for entry in entries:
                    entry["vector"] = self._vector(entry["payload"].get("data", ""))
            return entries
        points: list[dict[str, Any]] = []
        collection = self.memory.vector_store.collection_name
        offset = None
        while True:
            page, offset = self._qdrant.scroll(
                collection, limit=256, offset=offset, with_payload=True, with_vectors=with_vectors
            )
            for p in page:
                point: dict[str, Any] = {"id": str(p.id), "payload": p.payload}
                if with_vectors:
                    point["vector"] = list(p.vector)
                points.append(point)
            if offset is None:
                return points

    def _vector(self, text: str) -> list[float]:
        """The vector mem0 stored for `text`: mem0 embeds exactly the text a memory holds."""
        vector = self._embedded.get(text)
        if vector is None:
            vector = self._embedded[text] = self.embedder.embed(text, "add")
        return vector

    def memory_texts(self) -> list[str]:
        return sorted(p["payload"].get("data", "") for p in self._points(with_vectors=False))

    def memory_view(self) -> str:
        texts = self.memory_texts()
        relations = self.relation_lines()
        parts = [f"Stored memories ({len(texts)}):", *(f"- {t}" for t in texts)] if texts else []
        if relations:
            parts += [f"Graph relations ({len(relations)}):", *(f"- {r}" for r in relations)]
        # an empty memory renders as nothing: it supports no claim
        return "\n".join(parts)  # written memory only: never the unwritten message buffer

    def relation_lines(self) -> list[str]:
        """Every relation of the graph memory (none without one), sorted."""
        if self.graph is None:
            return []
        everything = self.graph.get_all({"user_id": USER_ID}, limit=1_000_000)
        return sorted(relation_line(r) for r in everything)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "memories": len(self._points(with_vectors=False)),
            **({"relations": len(self.relation_lines())} if self.graph is not None else {}),
            "writes": self.writes,
            "write_errors": self.llm.schema_failures - self.read_errors,
            **({"read_errors": self.read_errors} if self.graph is not None else {}),
            **{f"events_{k.lower()}": v for k, v in self.events.items()},
            "buffered_messages": len(self.buffer.messages),
        }

    def _state(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer.state(),
            "writes": self.writes,
            "events": self.events,
            "write_errors": self.llm.schema_failures - self.read_errors,
            **({"read_errors": self.read_errors} if self.graph is not None else {}),
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.buffer = MessageBuffer.from_state(
            self.config.update_freq, self.config.short_term_len, state["buffer"]
        )
        self.writes = int(state["writes"])
        self.events = {k: int(v) for k, v in state["events"].items()}
        self.read_errors = int(state.get("read_errors", 0))
        self.llm.schema_failures = int(state["write_errors"]) + self.read_errors

    def _save_extra(self, directory: Path) -> None:
        points = self._points(with_vectors=True)
        points.sort(
            key=lambda p: (
                int(p["payload"].get("write_step") or 0),
                p["payload"].get("data", ""),
                p["id"],
            )
        )
        atomic_write_json(
            directory / MEMORIES_FILE,
            sort_keys=True,
            value={"dims": self.embedder.dims, "points": points},
            indent=None,
        )
        if self.program is not None:
            save_program(self.program, directory / PROGRAM_FILE)
        if self.graph is not None:
            save_graph(self.graph, directory / GRAPH_FILE)

    def _load_extra(self, directory: Path) -> None:
        data = read_json(directory / MEMORIES_FILE)
        if data.get("dims") != self.embedder.dims:
            raise UserError(
                f"{directory / MEMORIES_FILE}: vectors of {data.get('dims')} "
                f"dimensions, but embedding_model gives {self.embedder.dims}"
            )
        if self.program is not None:
            load_program(self.program, directory / PROGRAM_FILE)
            self._sync_prompts()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.memory.vector_store.reset()
        if data["points"]:
            self.memory.vector_store.insert(
                vectors=[p["vector"] for p in data["points"]],
                payloads=[p["payload"] for p in data["points"]],
                ids=[p["id"] for p in data["points"]],
            )
            for p in data["points"]:
                self._embedded.setdefault(p["payload"].get("data", ""), p["vector"])
        if self.graph is not None:
            load_graph(self.graph, directory / GRAPH_FILE)

    def close(self) -> None:
        try:
            if self._drop_collection:  # once: close() twice is safe
                self._drop_collection = False
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.memory.vector_store.delete_col()
            self.memory.close()
            if self.graph is not None:
                close_graph(self.graph)
            if self._qdrant is not None:
                self._qdrant.close()
        finally:
            shutil.rmtree(self._private_dir, ignore_errors=True)


class AWEPolicy(_ExternalMemoryPolicy):
    """Agentic write, external (mem0 with infer=True)."""

    kind = "awe"
    infer = True


class RAGPolicy(_ExternalMemoryPolicy):
    """Raw messages in the vector store (mem0 with infer=False: embeddings only, no LLM)."""

    kind = "rag"
    infer = False

    def _to_mem0(self, batch: list[Message]) -> list[Message]:
        # The speaker is part of the text, so a retrieved message says who said it.
        return [{"role": m["role"], "content": f"{m['role']}: {m['content']}"} for m in batch]
