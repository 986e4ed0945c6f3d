"""The assistants under test: native LLM, AWI, AWE and RAG memory policies and their configs.

The policies sit behind the Policy contract (environment/policy.py; its conformance suite is
environment/policy_check.py).

The heavy libraries (DSPy, mem0, sentence-transformers) load only when a policy is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memloop.policies.base import Answer, BasePolicy
from memloop.policies.config import (
    AWEConfig,
    AWIConfig,
    NativeConfig,
    PolicyConfig,
    RAGConfig,
    load_policy_config,
    parse_policy_config,
)

if TYPE_CHECKING:
    from memloop.llm.client import ChatClient

__all__ = [
    "AWEConfig",
    "AWIConfig",
    "Answer",
    "NativeConfig",
    "PolicyConfig",
    "RAGConfig",
    "build_policy",
    "load_policy_config",
    "parse_policy_config",
]


def build_policy(
    config: Any,
    client: ChatClient,
    workdir: Path | str | None = None,
    *,
    prompts: dict[str, str] | None = None,
) -> Any:
    """A fresh policy (empty memory) for `config`, calling `client`.

    Files it needs while running go under `workdir`. `prompts` replaces some of its default
    memory-write prompts.
    """
    policy: BasePolicy
    if isinstance(config, NativeConfig):
        from memloop.policies.native import NativePolicy

        policy = NativePolicy(config, client, workdir)
    elif isinstance(config, AWIConfig):
        from memloop.policies.awi import AWIPolicy

        policy = AWIPolicy(config, client, workdir)
    elif isinstance(config, AWEConfig):
        from memloop.policies.external import AWEPolicy

        policy = AWEPolicy(config, client, workdir)
    elif isinstance(config, RAGConfig):
        from memloop.policies.external import RAGPolicy

        policy = RAGPolicy(config, client, workdir)
    else:
        raise TypeError(f"not a policy config: {config!r}")
    if prompts:
        fresh = policy.with_prompts(prompts)
        policy.close()
        policy = fresh
    return policy
