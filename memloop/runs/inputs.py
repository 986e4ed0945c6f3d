"""What every command starts from, loaded one way: an environment, a policy, the role clients.

The endpoint rule (`roles`) is the one every command uses: a role without an endpoint file uses
the agent's, and an agent without one is the embedded model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import file_sha256
from memloop.environment.data import UserItem
from memloop.environment.datafile import load_items, local_path
from memloop.llm.endpoint import EndpointRef
from memloop.llm.roles import RoleClients


def load_environment(spec: Any) -> tuple[list[UserItem], dict[str, Any]]:
    """The items of an environment spec (`path` or `procedural`) and their description.

    A data file is described by its name and sha256 (no machine path: a moved or copied file
    with the same contents is the same environment), an hf:// reference by the reference and
    its file's sha256; a procedural environment by its arguments and the sha256 of the
    catalogue it draws from, so an edited catalogue is a new environment.
    """
    if spec.path:
        return load_items(local_path(spec.path)), describe_data_file(spec.path)
    from memloop.environment.procedural import ProceduralSpec, generate_procedural

    args = spec.procedural.model_dump()
    return generate_procedural(**args), {"procedural": ProceduralSpec(**args).describe()}


def describe_data_file(path: str | Path) -> dict[str, str]:
    """A data file in a run's identity: its name (an hf:// reference as it is) and sha256."""
    local = local_path(str(path))  # an hf:// reference: its file in the Hugging Face cache
    text = str(path)
    return {"path": text if "://" in text else Path(text).name, "sha256": file_sha256(local)}


ACCEPT_PRIVATE = "accept_private_values"
"""The policy YAML key that accepts starting prompts naming the run's users' private values."""


def load_policy(
    path: str | Path, tracking_uri: str | None = None, users: Iterable[UserItem] | None = None
) -> Any:
    """A policy YAML's config; a plug-in's class must have every method of the Policy contract.

    The full conformance suite is `memloop policy check`; this refuses, in one line and before
    anything runs, a class that cannot be one. With `users` (the run's users), starting prompts
    (`prompts:` or `prompts_from:`) that name one of their private values are refused too
    (`check_starting_prompts`), unless the YAML says ``accept_private_values: true``.
    """
    from memloop.core.config import load_yaml_mapping
    from memloop.environment.policy_check import missing_members
    from memloop.policies import PluginConfig, parse_policy_config, registry
    from memloop.policies.config import with_prompt_settings

    path = Path(path)
    data = load_yaml_mapping(path)
    accept = data.pop(ACCEPT_PRIVATE, False)
    if not isinstance(accept, bool):
        raise UserError(f"{path}: key {ACCEPT_PRIVATE!r}: expected true or false, got {accept!r}")
    key = "prompts_from" if "prompts_from" in data else "prompts"
    if "prompts_from" in data:
        data = {**data, "prompts": prompts_from(data, path, tracking_uri)}
        del data["prompts_from"]
    config = parse_policy_config(data, str(path), base_dir=path.parent)
    config = with_prompt_settings(config, str(path))  # settings a prompt file carries
    if users is not None and not accept:
        check_starting_prompts(getattr(config, "prompts", None), users, f"{path}: key {key!r}")
    if isinstance(config, PluginConfig):
        cls = registry.plugin_class(config)
        missing = missing_members(cls)
        if missing:
            raise UserError(
                f"{path}: key 'type': {cls.__name__} does not meet the Policy contract: it has no "
                f"{', '.join(missing)} (memloop policy check {path} lists every promise)"
            )
    return config


def check_starting_prompts(
    prompts: dict[str, str] | None, users: Iterable[UserItem], where: str
) -> None:
    """Refuse starting prompts that name a private value of `users`, in one line.

    A prompt a run starts from is registered and evolved as a prompt shared by every user, so
    the same rule holds for it as for every candidate (`core.leaks`). The line says how many
    values, never which (it is printed and may be logged).
    """
    from memloop.core.leaks import ValueIndex

    if not prompts:
        return
    index = ValueIndex(v for item in users for v in item.private_values())
    hits = {v for text in prompts.values() for v in index.named_in(text)}
    if hits:
        n = len(hits)
        raise UserError(
            f"{where}: the starting prompts name {n} private value{'s' if n != 1 else ''} of "
            "this run's users, and a prompt shared by every user must name none; remove "
            f"{'them' if n != 1 else 'it'}, or add `{ACCEPT_PRIVATE}: true` to the policy YAML "
            "to start from them anyway"
        )


def prompts_from(
    data: dict[str, Any], path: Path, tracking_uri: str | None = None
) -> dict[str, str]:
    """The prompts a policy YAML's ``prompts_from:`` names, as its ``prompts:`` would hold them.

    A file (`memloop export`'s text, mem0 or DSPy format; relative to the YAML's folder) or a
    registry version, ``prompts:/NAME@best`` or ``prompts:/NAME/VERSION``, read from
    `tracking_uri` (an evolve's own store), else the one ``MLFLOW_TRACKING_URI`` names, else
    memloop's default (``./mlruns``). The run identity holds
    the prompts themselves, so the same source with other contents is another run.
    """
    import os

    from memloop.core.settings import DEFAULT_TRACKING_URI
    from memloop.policies.config import CONFIG_TYPES
    from memloop.policies.prompt_files import read_prompt_file

    source = data["prompts_from"]
    where = f"{path}: key 'prompts_from'"
    if "prompts" in data:
        raise UserError(f"{where}: give 'prompts' or 'prompts_from', not both")
    if data.get("type") not in CONFIG_TYPES:
        raise UserError(f"{where}: built-in policies only ({', '.join(CONFIG_TYPES)})")
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{where}: expected a file or prompts:/NAME@ALIAS, got {source!r}")
    if source.startswith("prompts:"):
        from memloop.runs import tracker

        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        return tracker.registered_prompts(uri, source)
    return read_prompt_file(prompt_file(source, path))


def prompt_file(source: str, yaml_path: Path) -> Path:
    """The file a policy YAML's ``prompts_from:`` names: relative to the YAML's folder."""
    file = Path(source).expanduser()
    return file if file.is_absolute() else yaml_path.parent / file


def roles(
    agent: EndpointRef = None,
    user_sim: EndpointRef = None,
    checker: EndpointRef = None,
    optimizer: EndpointRef = None,
    *,
    cache: Any = "default",
) -> RoleClients:
    """The role clients of every command: a role without an endpoint file uses the agent's.

    An endpoint may also be one made in memory (the command line's `--model`), as its file would.
    """
    return RoleClients.from_files(
        agent, user_sim or agent, checker or agent, optimizer or agent, cache=cache
    )
