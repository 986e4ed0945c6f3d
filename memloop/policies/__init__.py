"""The assistants under test: native LLM, AWI, AWE and RAG memory policies and their configs.

The policies sit behind the Policy contract (environment/policy.py; its conformance suite is
environment/policy_check.py).

The heavy libraries (DSPy, mem0, sentence-transformers) load only when a policy is built.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from memloop.core.errors import UserError
from memloop.policies.base import Answer
from memloop.policies.config import (
    AnyPolicyConfig,
    AWEConfig,
    AWIConfig,
    NativeConfig,
    PluginConfig,
    PolicyConfig,
    RAGConfig,
    load_policy_config,
    parse_policy_config,
    recorder_config,
)

if TYPE_CHECKING:
    from memloop.llm.client import ChatClient

__all__ = [
    "AWEConfig",
    "AnyPolicyConfig",
    "PluginConfig",
    "AWIConfig",
    "Answer",
    "NativeConfig",
    "PolicyConfig",
    "RAGConfig",
    "build_policy",
    "load_policy_config",
    "parse_policy_config",
    "policy_prompts",
    "recorder_config",
]


_SCRATCH: list[tempfile.TemporaryDirectory] = []  # plug-ins' folders when none was given


def policy_prompts(config: Any, client: ChatClient, build: Any = None) -> dict[str, str]:
    """The memory-write prompts a fresh policy of `config` starts from ({} when it has none).

    Part of what defines a run's numbers: an edited default prompt makes another run.
    `build` replaces `build_policy` (tests). A plug-in whose `prompts()` raises or returns
    anything but a dict of str to str is one line naming it (`core.plugins`).
    """
    from memloop.core.plugins import call, checked_prompts

    policy = (build or build_policy)(config, client, None)
    try:
        return dict(checked_prompts(policy))
    finally:
        call(policy, "close")


def build_policy(
    config: Any,
    client: ChatClient,
    workdir: Path | str | None = None,
    *,
    prompts: dict[str, str] | None = None,
) -> Any:
    """A fresh policy (empty memory) for `config`, calling `client`.

    Every type goes through the registry (policies/registry.py) and is built as
    `Class(options, client, workdir)`. Files it needs while running go under `workdir` (a plug-in
    always gets a folder: a temporary one, removed at exit, when the caller gives none).
    `prompts` replaces some of its default memory-write prompts (after the config's own
    `prompts:`, which replace the defaults first).
    """
    from memloop.policies import registry
    from memloop.policies.config import apply_params, split_settings, with_prompt_settings

    # prompts may carry settings (SETTINGS_KEY): the config's own, then `prompts`' set its options
    config = with_prompt_settings(config, "policy")
    texts, settings = split_settings(prompts)
    prompts = {**(getattr(config, "prompts", None) or {}), **texts}
    if settings:
        config = apply_params(config, settings, f"policy settings {settings}")
    if isinstance(config, PluginConfig):
        where = f"policy {config.type!r}"
        cls = registry.plugin_class(config)
        if workdir is None:
            _SCRATCH.append(tempfile.TemporaryDirectory(prefix="memloop-policy-"))
            workdir = _SCRATCH[-1].name
        Path(workdir).mkdir(parents=True, exist_ok=True)
        try:
            policy = cls(dict(config.options), client, Path(workdir))
        except UserError:
            raise
        except Exception as exc:  # the plug-in's own error, in one line
            raise UserError(
                f"{where}: {cls.__name__}(options, client, workdir) failed: "
                f"{type(exc).__name__}: {exc}".splitlines()[0]
            ) from exc
    elif isinstance(config, BaseModel) and getattr(config, "type", None) in registry.BUILTIN:
        kind = config.type  # type: ignore[attr-defined]
        cls = registry.load_class(registry.PolicySource(kind, registry.BUILTIN[kind], None), kind)
        policy = cls(config, client, workdir)
    else:
        raise TypeError(f"not a policy config: {config!r}")
    if prompts:
        from memloop.core.plugins import call  # a plug-in's exception: one line naming it

        fresh = call(policy, "with_prompts", prompts)
        call(policy, "close")
        policy = fresh
    return policy
