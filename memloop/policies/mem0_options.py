"""The mem0 options of AWE and RAG: `vector_store:` and (AWE only) `graph_store:`, passed to mem0.

`vector_store: {provider: NAME, config: {...}}` is mem0's own vector store setting, checked by
mem0's own config classes when the policy YAML is read. memloop owns four things in it:

- `collection_name` and, for a local store, `path`: every policy instance gets its own store, so
  parallel users never share memories. A local store (faiss, chroma or qdrant without a server)
  lives in the policy's private folder under the user's workdir and is removed when the policy
  closes; a server store gets a collection named after that folder, dropped when it closes.
- `embedding_model_dims`: the embedding model's (a different value is refused).
- mem0's embedder and LLM: memloop routes them (the policy's `embedding_model`, its endpoint).
- secrets: a key ending in `_env` names the environment variable holding the value of the key
  without it (`password_env: PGPASSWORD`); the config, and so the run's identity, never holds the
  secret itself.

`graph_store: {provider: kuzu, threshold: ..., custom_prompt: ...}` is mem0's graph memory on
the embedded Kùzu database: one in-memory graph per policy instance (so `config.db` is memloop's),
its LLM and embedder routed like the rest of mem0's (`llm:` refused). Graph stores on a server
(neo4j, memgraph, neptune, apache_age) are refused: mem0 keeps every user of a server graph under
the same user id here, so parallel users would share one graph. RAG writes without an LLM, so it
has no graph.

Importing mem0 takes about a second, so this module imports it only when a store is named.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from pathlib import Path
from typing import Any

from memloop.core.config import KeyProblem
from memloop.core.credentials import ENV_NAME, looks_secret, secret_path, url_problem
from memloop.core.errors import UserError

GRAPH_STORE_OF_RAG = (
    "RAG writes raw messages without an LLM, and mem0's graph memory is written by an LLM: use "
    "type: awe for a graph"
)
GRAPH_PROVIDERS = ("kuzu",)
# mem0 1.x's other graph stores (its GraphStoreConfig's providers): each lives on a server
SERVER_GRAPHS = ("neo4j", "memgraph", "neptune", "neptunedb", "apache_age")
GRAPH_SERVER_REFUSED = (
    "mem0's {provider} graph lives on a server where every user would share one graph (mem0 "
    "files them all under one user id here); memloop offers the embedded graph: provider: kuzu"
)
ROUTED = {
    "embedder": "memloop routes mem0's embedder (the policy's embedding_model), not set here",
    "llm": "memloop routes mem0's LLM (the policy's endpoint), not set here",
    "graph_store": "a mem0 option of its own: write graph_store: beside vector_store:",
}
OWNED = {
    "collection_name": "memloop names one collection per user and policy; leave it out",
    "path": "memloop keeps a local store in the policy's folder under each user's workdir "
    "(removed when the policy closes; checkpoints keep the memories); leave it out",
}
# Fields that hold a credential: named through an environment variable (`<field>_env`) only.
SECRETS = frozenset(
    {
        "api_key",
        "password",
        "token",
        "access_token",
        "client_secret",
        "azure_client_secret",
        "auth_client_secret",
        "connection_string",
    }
)
COLLECTION = "memories"  # a store of one policy instance: the default, or a local one
# Stores kept in a folder, and the groups of keys that make mem0 open a server's client instead
# (mem0's own rules: mem0/vector_stores/qdrant.py and chroma.py).
LOCAL_STORES: dict[str, tuple[tuple[str, ...], ...]] = {
    "qdrant": (("url",), ("api_key",), ("host", "port")),
    "chroma": (("api_key", "tenant"), ("host", "port")),
    "faiss": (),
}
_EXTRA = re.compile(r"Extra fields not allowed: (.*?)\. Please input only the following fields")


def _mem0() -> tuple[Any, Any]:
    from memloop.core.settings import apply_offline_defaults, import_keeping_warning_filters

    apply_offline_defaults()  # mem0 reads MEM0_TELEMETRY / MEM0_DIR when it is imported
    import_keeping_warning_filters("mem0")  # its import would turn DeprecationWarnings on
    from mem0.utils.factory import VectorStoreFactory
    from mem0.vector_stores.configs import VectorStoreConfig

    return VectorStoreConfig, VectorStoreFactory


def _config_class_names() -> dict[str, str]:
    """mem0's provider -> config class name (a private attribute of its VectorStoreConfig)."""
    config_cls, _ = _mem0()
    return dict(config_cls.__private_attributes__["_provider_configs"].default)


def store_config_class(provider: str) -> Any:
    """mem0's config class of a vector store provider (ImportError: its package is missing)."""
    module = importlib.import_module(f"mem0.configs.vector_stores.{provider}")
    return getattr(module, _config_class_names()[provider])


def providers() -> list[str]:
    """The vector stores mem0 both configures and builds."""
    _, factory = _mem0()
    return sorted(set(_config_class_names()) & set(factory.provider_to_class))


def check_vector_store(value: Any) -> dict[str, Any]:
    """The `vector_store:` option, checked as far as it can be before anything runs.

    Raises KeyProblem naming the key inside the option (`config.on_disk`) and what is wrong, in
    mem0's words where mem0 finds the fault.
    """
    if not isinstance(value, dict):
        raise KeyProblem("", "expected a mapping {provider: NAME, config: {...}}")
    for key in value:
        if key in ROUTED:
            raise KeyProblem(str(key), ROUTED[key])
        if key not in ("provider", "config"):
            raise KeyProblem(str(key), "unknown key (allowed: provider, config)")
    provider = value.get("provider")
    if not isinstance(provider, str):
        raise KeyProblem("provider", f"expected the name of a mem0 vector store, got {provider!r}")
    known = providers()
    if provider not in known:
        raise KeyProblem(
            "provider", f"mem0 has no vector store {provider!r} (one of: {', '.join(known)})"
        )
    config = value.get("config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise KeyProblem("config", f"expected a mapping of mem0's {provider} settings")
    _, factory = _mem0()
    try:
        fields = set(store_config_class(provider).model_fields)
        importlib.import_module(factory.provider_to_class[provider].rsplit(".", 1)[0])
    except ImportError as exc:
        missing = " ".join(str(exc).split())
        problem = f"mem0's {provider} store cannot be loaded: {missing}"
        raise KeyProblem("provider", problem) from None
    given = {}
    for key, setting in config.items():
        where = f"config.{key}"
        credential = _credential_problem(key, setting, fields)
        if credential is not None:
            raise KeyProblem(where, credential)
        if key in ROUTED:
            raise KeyProblem(where, ROUTED[key])
        if key in OWNED:
            raise KeyProblem(where, OWNED[key])
        secret = _secret_of(key, fields)
        if secret is not None:
            if secret in config:
                raise KeyProblem(where, f"give {secret} or {key}, not both")
            if not isinstance(setting, str) or not ENV_NAME.match(setting):
                raise KeyProblem(
                    where, "must be the NAME of an environment variable (letters, digits, _)"
                )
            given[secret] = f"(read from ${setting})"
            continue
        if key not in fields:
            allowed = ", ".join(sorted(fields - set(OWNED) - {"client", "connection_pool"}))
            raise KeyProblem(where, f"not a setting of mem0's {provider} store (it has: {allowed})")
        if key in SECRETS:
            raise KeyProblem(
                where,
                "a secret in a policy file is copied into run records and checkpoints: write "
                f"{key}_env: NAME (the environment variable that holds it) instead",
            )
        given[key] = setting
    half = _half_a_server(provider, config)
    if half is not None:
        raise half
    if is_local({"provider": provider, "config": config}) and "path" in fields:
        given["path"] = "(the policy's folder)"  # keeps mem0 from defaulting to /tmp/<provider>
    config_cls, _ = _mem0()
    try:
        config_cls(provider=provider, config=given)
    except ValueError as exc:  # pydantic's ValidationError, or a mem0 validator's own
        raise _mem0_problem(exc, provider) from None
    return {"provider": provider, "config": dict(config)}


def _credential_problem(key: str, setting: Any, fields: set[str]) -> str | None:
    """Why a store setting would store a credential (spec.json, checkpoints, MLflow), or None.

    A URL with user info, a secret-looking query parameter or a fragment, and a value shaped
    like a credential (`sk-...`, a JWT, ...) at any depth, whatever the key's name. A secret
    field (`api_key`, ...) has its own message below; `<field>_env` names a variable.
    """
    if _secret_of(key, fields) is not None or key in SECRETS:
        return None
    if isinstance(setting, str) and "://" in setting:
        problem = url_problem(setting)
        if problem is not None:
            if _secret_of(f"{key}_env", fields) is None:  # no `<key>_env` for this field
                return f"the URL {problem}: remove the credential from it"
            return (
                f"the URL {problem}: remove it, or give the whole URL through the environment: "
                f"{key}_env: NAME"
            )
    # a name like a credential's holds one, unless it is a flag, a number, a URL (checked
    # above) or a file's location (vertex_ai's credentials_path)
    named_so = looks_secret(key) and not key.endswith(("url", "uri", "_path", "_file"))
    if secret_path(setting) is not None or (named_so and isinstance(setting, str | list | dict)):
        secret_fields = ", ".join(sorted(SECRETS & fields)) or "this store has none"
        return (
            "looks like a secret, and a store's settings are stored with the run: remove it "
            f"and give the credential in a secret field's <field>_env: NAME ({secret_fields})"
        )
    return None


def check_graph_store(value: Any) -> dict[str, Any]:
    """The `graph_store:` option, checked by mem0's GraphStoreConfig (KeyProblem as above)."""
    if not isinstance(value, dict):
        raise KeyProblem("", "expected a mapping {provider: kuzu, threshold: ..., ...}")
    allowed = ("provider", "config", "threshold", "custom_prompt")
    for key in value:
        if key in ROUTED:
            raise KeyProblem(str(key), ROUTED[key])
        if key not in allowed:
            raise KeyProblem(str(key), f"unknown key (allowed: {', '.join(allowed)})")
    _mem0()  # mem0 imported with memloop's offline defaults
    from mem0.graphs.configs import GraphStoreConfig

    provider = value.get("provider")
    if provider is None:
        raise KeyProblem("provider", "name the graph store: provider: kuzu")
    if provider in SERVER_GRAPHS:
        raise KeyProblem("provider", GRAPH_SERVER_REFUSED.format(provider=provider))
    if provider not in GRAPH_PROVIDERS:
        raise KeyProblem("provider", f"mem0 has no graph store {provider!r}")
    config = value.get("config") or {}
    if not isinstance(config, dict):
        raise KeyProblem("config", "expected a mapping")
    for key in config:
        if key == "db":
            raise KeyProblem(
                "config.db",
                "memloop keeps one in-memory graph per user and policy (checkpoints keep it); "
                "leave it out",
            )
        raise KeyProblem(f"config.{key}", "not a setting of mem0's kuzu graph (it has: db)")
    try:
        importlib.import_module("mem0.memory.kuzu_memory")
    except ImportError as exc:
        missing = " ".join(str(exc).split())
        raise KeyProblem(
            "provider",
            f"mem0's kuzu graph cannot be loaded: {missing} (pip install 'memloop[graph]')",
        ) from None
    option: dict[str, Any] = {k: value[k] for k in ("threshold", "custom_prompt") if k in value}
    try:
        GraphStoreConfig(provider="kuzu", config={"db": ":memory:"}, **option)
    except ValueError as exc:  # pydantic's ValidationError, or a mem0 validator's own
        loc, message = _first_error(exc)
        raise KeyProblem(loc, f"{' '.join(message.split())} (mem0's graph store)") from None
    return {"provider": "kuzu", **option}


def mem0_graph_store(option: dict[str, Any]) -> dict[str, Any]:
    """mem0's `graph_store` setting for one policy instance: its own in-memory Kùzu graph."""
    settings: dict[str, Any] = {k: option[k] for k in ("threshold", "custom_prompt") if k in option}
    return {"provider": "kuzu", "config": {"db": ":memory:"}, **settings}


def _secret_of(key: Any, fields: set[str]) -> str | None:
    """The field a `<field>_env` key names: a secret one, or a URL (None for any other key)."""
    if isinstance(key, str) and key.endswith("_env"):
        field = key[: -len("_env")]
        if field in fields and (field in SECRETS or field.endswith(("url", "uri"))):
            return field
    return None


def secret_keys(option: dict[str, Any]) -> list[str]:
    """The `<field>_env` keys of a `vector_store:` option (credentials read at run time)."""
    fields = set(store_config_class(option["provider"]).model_fields)
    return [k for k in (option.get("config") or {}) if _secret_of(k, fields) is not None]


def _first_error(exc: ValueError) -> tuple[str, str]:
    """(the dotted key, the message) of the first problem a mem0 config class found."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return ".".join(str(p) for p in first["loc"]), first["msg"].removeprefix("Value error, ")
    return "", str(exc)


def _mem0_problem(exc: ValueError, provider: str) -> KeyProblem:
    loc, message = _first_error(exc)
    extra = _EXTRA.match(message)
    if extra:  # mem0's list of fields comes in set order: name only the offending one
        return KeyProblem(f"config.{extra.group(1)}", f"not a setting of mem0's {provider} store")
    message = " ".join(message.split())
    return KeyProblem(f"config.{loc}" if loc else "config", f"{message} (mem0's {provider} store)")


def is_local(option: dict[str, Any]) -> bool:
    """A store kept in a folder (faiss, chroma or qdrant without a server)."""
    config = option.get("config") or {}
    groups = LOCAL_STORES.get(option["provider"])
    if groups is None:
        return False
    return not any(all(_given(config, k) for k in group) for group in groups)


def _given(config: dict[str, Any], key: str) -> bool:
    return config.get(key) is not None or f"{key}_env" in config


def _half_a_server(provider: str, config: dict[str, Any]) -> KeyProblem | None:
    """A server key mem0 would ignore, opening a local store instead (qdrant's host alone)."""
    groups = LOCAL_STORES.get(provider, ())
    if not is_local({"provider": provider, "config": config}):
        return None
    for key in config:
        if any(key in (k, f"{k}_env") for group in groups for k in group):
            ways = [" and ".join(group) for group in groups]
            either = ", ".join(ways[:-1]) + (", or " if len(ways) > 2 else " or ") + ways[-1]
            return KeyProblem(
                f"config.{key}",
                f"mem0 opens a {provider} server only given {either}; with {key} alone it would "
                "open a local store: give the rest, or leave it out",
            )
    return None


def collection_for(kind: str, folder: Path) -> str:
    """A server store's collection for one policy instance: a valid name for every provider."""
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return f"memloop_{kind}_{digest}"


def mem0_vector_store(
    option: dict[str, Any], *, dims: int, folder: Path, kind: str
) -> dict[str, Any]:
    """mem0's `vector_store` setting for one policy instance.

    `folder` is the policy's private folder (unique to the instance, under the user's workdir):
    a local store is the collection `memories` in `folder/vector-store`, a server store the
    collection `collection_for(kind, folder)`.
    """
    provider = option["provider"]
    fields = set(store_config_class(provider).model_fields)
    settings: dict[str, Any] = {}
    for key, value in (option.get("config") or {}).items():
        secret = _secret_of(key, fields)
        if secret is None:
            settings[key] = value
            continue
        settings[secret] = os.environ.get(value)
        if not settings[secret]:
            raise UserError(
                f"vector_store.config.{key}: environment variable {value} is not set "
                "(export it first)"
            )
    wanted = settings.get("embedding_model_dims")
    if wanted is not None and wanted != dims:
        raise UserError(
            f"vector_store.config.embedding_model_dims: {wanted}, but embedding_model gives "
            f"{dims}-dimensional vectors (leave it out: memloop sets it)"
        )
    if "embedding_model_dims" in fields:
        settings["embedding_model_dims"] = dims
    if is_local(option):
        settings["collection_name"] = COLLECTION
        settings["path"] = str(folder / "vector-store")
    else:
        settings["collection_name"] = collection_for(kind, folder)
    return {"provider": provider, "config": settings}


def listed(store: Any) -> list[Any]:
    """Every entry of a mem0 vector store, through its generic `list` (no paging in mem0's API).

    Providers return either the entries or `[entries]` (or qdrant's `(entries, offset)`); the
    limit grows until a listing comes back short of it.
    """
    limit = 1024
    while True:
        result = store.list(filters=None, limit=limit)
        entries = result
        if isinstance(result, list | tuple) and result and isinstance(result[0], list | tuple):
            entries = result[0]
        entries = list(entries or [])
        if len(entries) < limit:
            return entries
        limit *= 4
