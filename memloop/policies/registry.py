"""Where a policy class comes from: the registry every `type:` of a policy YAML goes through.

A `type:` resolves by the rule every memloop registry follows (core/plugins.py `Registry`),
first match wins:
1. a built-in: `native`, `awi`, `awe`, `rag`;
2. a name registered in this process with `register("name", Cls)` (a built-in's name is refused);
3. a short name an installed package registers in the entry-point group `memloop.policies`
   (value `package.module:Class`; one with a built-in's name is ignored);
4. `package.module:ClassName` (an importable class) or `path/to/file.py:ClassName` (a class in a
   Python file; a relative path is relative to the folder of the YAML file that names it, the
   one path rule of memloop's YAML files).

Every class is built the same way: `Class(options, client, workdir)`. A built-in gets its typed
config as `options`; a plug-in the YAML's other keys as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.core import plugins
from memloop.core.errors import UserError
from memloop.core.files import file_sha256
from memloop.core.plugins import MissingName, import_target

ENTRY_POINT_GROUP = "memloop.policies"
POLICY_MEMBERS = ("respond", "answer", "memory_view")  # enough to tell a policy class

REGISTRY = plugins.Registry(
    ENTRY_POINT_GROUP,
    {
        "native": ("policy", "memloop.policies.native:NativePolicy"),
        "awi": ("policy", "memloop.policies.awi:AWIPolicy"),
        "awe": ("policy", "memloop.policies.external:AWEPolicy"),
        "rag": ("policy", "memloop.policies.external:RAGPolicy"),
    },
    lambda cls: "policy" if all(hasattr(cls, m) for m in POLICY_MEMBERS) else None,
)
BUILTIN: dict[str, str] = {name: target for name, (_, target) in REGISTRY.builtin.items()}


def register(name: str, cls: type) -> None:
    """Make policy class `cls` available as `type: name` (a built-in's name is refused)."""
    REGISTRY.register(name, cls)


@dataclass(frozen=True)
class PolicySource:
    """A resolved `type:`: the class target, and the file it lives in (None: built-in)."""

    type: str  # as written in the YAML
    target: str  # "package.module:Class" or "/abs/path/file.py:Class"
    file: str | None  # the source file of a plug-in, hashed into the run identity

    def sha256(self) -> str | None:
        return file_sha256(self.file) if self.file else None


def installed() -> dict[str, str]:
    """{short name: target} registered by installed packages (entry points)."""
    return REGISTRY.installed()


def known_names() -> list[str]:
    return REGISTRY.names()


def resolve(kind: str, where: str, base_dir: Path | None = None) -> PolicySource:
    """The class target a `type:` names; one-line UserError when it names nothing."""
    if kind in BUILTIN:
        return PolicySource(kind, BUILTIN[kind], None)
    found = REGISTRY.lookup(kind)
    if isinstance(found, type):  # registered in this process: load_class takes it from there
        return PolicySource(kind, f"{found.__module__}:{found.__qualname__}", None)
    if found is None:
        raise UserError(
            f"{where}: key 'type': unknown policy type {kind!r} (registered: "
            f"{', '.join(known_names())}; or 'package.module:ClassName' or "
            "'path/to/file.py:ClassName')"
        )
    target = found
    module, _, cls = target.rpartition(":")
    if not module or not cls.isidentifier():
        raise UserError(
            f"{where}: key 'type': {kind!r} is not 'package.module:ClassName' or "
            "'path/to/file.py:ClassName'"
        )
    if module.endswith(".py"):
        path = plugins.plugin_file(module, base_dir, f"{where}: key 'type'")
        return PolicySource(kind, f"{path}:{cls}", str(path))
    return PolicySource(kind, target, None)


def load_class(source: PolicySource, where: str) -> type:
    """Import the class of `source`; one-line UserError when it does not import."""
    registered = REGISTRY.registered.get(source.type)  # never a built-in's name
    if registered is not None:
        return registered
    module_name, _, cls_name = source.target.rpartition(":")
    try:
        cls = import_target(source.target)
    except MissingName:
        raise UserError(f"{where}: key 'type': {module_name} has no class {cls_name}") from None
    except Exception as exc:  # the user's code: any error is a bad `type:`
        raise UserError(
            f"{where}: key 'type': {source.type!r} does not import: "
            f"{type(exc).__name__}: {exc}".splitlines()[0]
        ) from None
    if not isinstance(cls, type):
        raise UserError(
            f"{where}: key 'type': {source.type!r} is a {type(cls).__name__}, not a class"
        )
    return cls


def plugin_class(config: Any) -> type:
    """The class of a PluginConfig (imported when its YAML was read, so this cannot fail twice)."""
    return load_class(PolicySource(config.type, config.target, None), f"policy {config.type!r}")
