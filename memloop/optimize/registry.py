"""Every optimizer by name: the one registry of evolvers and searches.

A name in an experiment YAML (`evolvers: [...]`, `search: ...`) resolves by the rule every
memloop registry follows (core/plugins.py `Registry`), first match wins:
1. a built-in: the evolvers `none`, `reflective`, `playbook`, `edits`, and the searches
   `episode`, `period`, `gepa` (kind declared in the table);
2. a name registered in this process with `register("name", Cls)` (a built-in's name is refused);
3. a short name an installed package registers in the entry-point group `memloop.optimizers`
   (value `package.module:Class`; one with a built-in's name is ignored);
4. `package.module:Class` or `path/to/file.py:Class` (relative to the YAML file's folder).

Naming code runs it: the module is imported when the name is resolved. A class is an evolver
when it has `propose`, a search when it has `cycles` (optimize/contract.py); both declare a
pydantic `Settings` model, validated here from the YAML's `settings: {<name>: {...}}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from memloop.core import plugins
from memloop.core.errors import UserError
from memloop.optimize.contract import EVOLVER_MEMBERS, SEARCH_MEMBERS, Evolver, Search

Kind = Literal["evolver", "search"]
ENTRY_POINT_GROUP = "memloop.optimizers"
_MEMBERS: dict[Kind, tuple[str, ...]] = {"evolver": EVOLVER_MEMBERS, "search": SEARCH_MEMBERS}


def kind_of(cls: type) -> Kind | None:
    """Which contract `cls` implements, from its members (None: neither)."""
    for kind, members in _MEMBERS.items():
        if all(hasattr(cls, m) for m in members):
            return kind
    return None


REGISTRY = plugins.Registry(
    ENTRY_POINT_GROUP,
    {
        "none": ("evolver", "memloop.optimize.evolvers.none:NoEvolver"),
        "reflective": ("evolver", "memloop.optimize.evolvers.reflective:ReflectiveEvolver"),
        "playbook": ("evolver", "memloop.optimize.evolvers.playbook:PlaybookEvolver"),
        "edits": ("evolver", "memloop.optimize.evolvers.edits:EditsEvolver"),
        "episode": ("search", "memloop.optimize.searches.episode:EpisodeSearch"),
        "period": ("search", "memloop.optimize.searches.period:PeriodSearch"),
        "gepa": ("search", "memloop.optimize.searches.gepa:GepaSearch"),
    },
    kind_of,
    "{name} is neither an evolver (name, Settings, propose) nor a search "
    "(name, Settings, needs_val, evolves_itself, cycles)",
)
BUILTIN: dict[str, str] = {name: target for name, (_, target) in REGISTRY.builtin.items()}


def register(name: str, cls: type) -> None:
    """Make `cls` (an evolver or a search class) available by `name` in experiment YAML files.

    A built-in's name is refused (ValueError): a registered class never shadows a built-in.
    """
    REGISTRY.register(name, cls)


def names(kind: Kind) -> list[str]:
    """The names of `kind` known without importing a plug-in: built-in, registered, installed."""
    return REGISTRY.names(kind)


def optimizer_class(name: str, kind: Kind, key: str, base_dir: Path | None = None) -> type:
    """The class `name` resolves to, checked to be of `kind`; one line naming `key` if not."""
    found = REGISTRY.lookup(name)
    if isinstance(found, type):
        cls = found
    else:
        target = found or name
        if ":" not in target:
            raise UserError(
                f"key {key!r}: unknown {kind} {name!r}; use one of {', '.join(names(kind))}, "
                "'package.module:Class' or 'path/to/file.py:Class'"
            )
        module, _, attr = target.rpartition(":")
        if module.endswith(".py"):
            target = f"{plugins.plugin_file(module, base_dir, f'key {key!r}')}:{attr}"
        try:
            cls = plugins.import_target(target)
        except Exception as exc:  # the user's code: any error is a bad name
            raise UserError(
                f"key {key!r}: cannot load {name!r} ({type(exc).__name__}: {exc})".splitlines()[0]
            ) from None
    declared = kind_of(cls) if isinstance(cls, type) else None
    if declared != kind:
        raise UserError(
            f"key {key!r}: {name!r} is not an {kind} class (needs "
            f"{', '.join(_MEMBERS[kind])}; see memloop/optimize/contract.py)"
        )
    return cls


def settings(cls: type, raw: dict[str, Any] | None, key: str) -> BaseModel:
    """`cls.Settings` from the YAML's mapping; one line naming the setting when it is wrong."""
    model: type[BaseModel] = getattr(cls, "Settings")  # noqa: B009 (checked by kind_of)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields) or "none"
            raise UserError(
                f"key '{key}': unknown setting '{where}' (allowed: {allowed})"
            ) from None
        raise UserError(f"key '{key}.{where}': {err['msg']}") from None


def build_evolver(
    name: str, client: Any, raw: dict[str, Any] | None = None, base_dir: Path | None = None
) -> Evolver:
    """The evolver `name`, built on the optimizer role's `client` with its settings."""
    cls = optimizer_class(name, "evolver", "evolvers", base_dir)
    evolver: Evolver = cls(client, settings(cls, raw, f"settings.{name}"))
    return evolver


def build_search(
    name: str, raw: dict[str, Any] | None = None, base_dir: Path | None = None
) -> Search:
    """The search `name`, built with its settings."""
    cls = optimizer_class(name, "search", "search", base_dir)
    search: Search = cls(settings(cls, raw, f"settings.{name}"))
    return search
