"""What every command starts from, loaded one way: an environment, a policy, the role clients.

The endpoint rule (`roles`) is the one every command uses: a role without an endpoint file uses
the agent's, and an agent without one is the embedded model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import file_sha256
from memloop.environment.data import UserItem
from memloop.environment.datafile import load_items, local_path
from memloop.llm.roles import RoleClients


def load_environment(spec: Any) -> tuple[list[UserItem], dict[str, Any]]:
    """The items of an environment spec (`path` or `procedural`) and their description.

    A data file is described by its path and sha256; a procedural environment by its arguments
    and the sha256 of the catalogue it draws from, so an edited catalogue is a new environment.
    """
    if spec.path:
        local = local_path(spec.path)  # an hf:// reference: its file in the Hugging Face cache
        return load_items(local), {"path": spec.path, "sha256": file_sha256(local)}
    from memloop.environment.procedural import ProceduralSpec, generate_procedural

    args = spec.procedural.model_dump()
    return generate_procedural(**args), {"procedural": ProceduralSpec(**args).describe()}


def load_policy(path: str | Path) -> Any:
    """A policy YAML's config; a plug-in's class must have every method of the Policy contract.

    The full conformance suite is `memloop policy check`; this refuses, in one line and before
    anything runs, a class that cannot be one.
    """
    from memloop.environment.policy_check import missing_members
    from memloop.policies import PluginConfig, load_policy_config, registry

    config = load_policy_config(path)
    if isinstance(config, PluginConfig):
        cls = registry.plugin_class(config)
        missing = missing_members(cls)
        if missing:
            raise UserError(
                f"{path}: key 'type': {cls.__name__} does not meet the Policy contract: it has no "
                f"{', '.join(missing)} (memloop policy check {path} lists every promise)"
            )
    return config


def roles(
    agent: str | Path | None = None,
    user_sim: str | Path | None = None,
    checker: str | Path | None = None,
    optimizer: str | Path | None = None,
    *,
    cache: Any = "default",
) -> RoleClients:
    """The role clients of every command: a role without an endpoint file uses the agent's."""
    return RoleClients.from_files(
        agent, user_sim or agent, checker or agent, optimizer or agent, cache=cache
    )
