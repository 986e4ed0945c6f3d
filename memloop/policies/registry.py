"""Where a policy class comes from: the registry every `type:` of a policy YAML goes through.

A `type:` is one of
- a registered name: the built-in `native`, `awi`, `awe`, `rag`, or a short name an installed
  package registers in the entry-point group `memloop.policies` (value `package.module:Class`);
- `package.module:ClassName`: an importable class;
- `path/to/file.py:ClassName`: a class in a Python file (a relative path is relative to the folder
  of the YAML file that names it, the one path rule of memloop's YAML files).

Every class is built the same way: `Class(options, client, workdir)`. A built-in gets its typed
config as `options`; a plug-in the YAML's other keys as a dict. Built-in names win over installed
ones.
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

BUILTIN: dict[str, str] = {
    "native": "memloop.policies.native:NativePolicy",
    "awi": "memloop.policies.awi:AWIPolicy",
    "awe": "memloop.policies.external:AWEPolicy",
    "rag": "memloop.policies.external:RAGPolicy",
}


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
    return plugins.installed(ENTRY_POINT_GROUP)


def known_names() -> list[str]:
    return [*BUILTIN, *(n for n in installed() if n not in BUILTIN)]


def resolve(kind: str, where: str, base_dir: Path | None = None) -> PolicySource:
    """The class target a `type:` names; one-line UserError when it names nothing."""
    if kind in BUILTIN:
        return PolicySource(kind, BUILTIN[kind], None)
    registered = installed()
    if kind in registered:
        target = registered[kind]
    elif ":" in kind:
        target = kind
    else:
        raise UserError(
            f"{where}: key 'type': unknown policy type {kind!r} (registered: "
            f"{', '.join(known_names())}; or 'package.module:ClassName' or "
            "'path/to/file.py:ClassName')"
        )
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
