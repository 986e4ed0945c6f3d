"""YAML + pydantic config loading with one rule for paths.

The rule: a path written inside a YAML file is relative to the folder of that YAML file (an
absolute path, or one starting with ``~``, is taken as it is). When no file is there but memloop
ships one at that path (read from memloop/experiments/ or one of its folders, as the shipped YAMLs
name ``../policies/...``), the shipped file is used: a copy of a shipped YAML keeps naming the
shipped policies and endpoints. A path given on the command line is relative
to the working directory, as every shell user expects.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from memloop.core.errors import UserError
from memloop.core.files import read_user_text
from memloop.core.settings import SHIPPED_FILES

M = TypeVar("M", bound=BaseModel)


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (plain YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may repeat
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DatesAsText(UniqueKeyLoader):
    """UniqueKeyLoader that leaves timestamps as strings."""


_DatesAsText.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; an empty file is ``{}``.

    Unquoted dates stay strings (so an impossible date such as 2020-13-01 is reported by the
    validation of the key that holds it, not as a parser crash).
    """
    path = Path(path)
    text = read_user_text(path)
    try:
        data = yaml.load(text, Loader=_DatesAsText)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({yaml_problem(exc)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A parser error as one line: where it is (line and column, 1-based) and the problem.

    A tab where YAML expects indentation is named as such, with what to do.
    """
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem
        if "'\\t'" in problem:
            problem = "a tab character (YAML indents with spaces only: replace the tab)"
        return f"{where}{problem}"
    return " ".join(str(exc).split())


# what an unquoted YAML value becomes when it does not read as text
_NOT_TEXT = {bool: "a boolean", int: "a number", float: "a number", date: "a date"}


class KeyProblem(ValueError):
    """A validator's complaint about a key inside (or beside) the value it validates.

    :func:`parse_model` names ``key`` after the validated field's own (``vector_store.config.x``
    for a field validator of ``vector_store``; ``x`` alone from a model validator).
    """

    def __init__(self, key: str, problem: str):
        super().__init__(problem)
        self.key = key
        self.problem = problem


def parse_model(cls: type[M], data: Any, where: str) -> M:
    """Validate ``data`` into ``cls``; the first problem becomes one line naming the key."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        problem = (err.get("ctx") or {}).get("error")
        if isinstance(problem, KeyProblem):
            parts = [*(str(p) for p in err["loc"]), problem.key]
            key = ".".join(p for p in parts if p) or "(top level)"
            raise UserError(f"{where}: key '{key}': {problem.problem}") from None
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(cls.model_fields)
            raise UserError(f"{where}: unknown key '{key}' (allowed: {allowed})") from None
        value = err.get("input")
        kind = next((k for t, k in _NOT_TEXT.items() if isinstance(value, t)), None)
        if err["type"] == "string_type" and kind is not None:
            raise UserError(
                f"{where}: key '{key}': expected text, but YAML read the unquoted value as {kind} "
                f"({value!r}); quote it"
            ) from None
        if err["type"] == "int_type":
            raise UserError(
                f"{where}: key '{key}': expected a whole number, got {value!r}"
            ) from None
        message = err["msg"].removeprefix("Value error, ")  # a validator's own words
        raise UserError(f"{where}: key '{key}': {message}") from None


def resolve_relative(value: str, yaml_path: str | Path) -> str:
    """A path named inside ``yaml_path``, resolved against that file's folder.

    When nothing is there but memloop ships a file at that path, the shipped file: named from
    memloop/experiments/ (``policies/awe.yaml``) or as a shipped YAML names it from its own
    folder (``../policies/awe.yaml`` in tune/awe.yaml), so a copy of a shipped YAML works
    anywhere. A URI (``hf://OWNER/NAME``, any ``scheme://``) is not a path and is left alone.
    """
    if "://" in value:
        return value
    candidate = Path(value).expanduser()
    if candidate.is_absolute():
        return str(candidate)
    beside = (Path(yaml_path).resolve().parent / candidate).resolve()
    if not beside.exists() and (shipped := _shipped(candidate)) is not None:
        return str(shipped)  # a copied shipped YAML naming a shipped file
    return str(beside)


def _shipped(candidate: Path) -> Path | None:
    """The file memloop ships at `candidate`; None when it ships none there.

    `candidate` is read from memloop/experiments/ and from each of its folders (where the shipped
    YAMLs are, naming ../policies/ and ../endpoints/).
    """
    folders = [SHIPPED_FILES, *sorted(d for d in SHIPPED_FILES.iterdir() if d.is_dir())]
    for folder in folders:
        shipped = (folder / candidate).resolve()
        if shipped.is_file() and shipped.is_relative_to(SHIPPED_FILES):
            return shipped
    return None


def resolve_path_keys(
    data: dict[str, Any], yaml_path: str | Path, path_keys: Iterable[str]
) -> dict[str, Any]:
    """Apply :func:`resolve_relative` to the string values at the dotted ``path_keys``.

    Missing keys and non-string values (e.g. an inline mapping where a file may also be named)
    are left alone; ``data`` is not mutated.
    """
    out = copy.deepcopy(data)
    for dotted in path_keys:
        parts = dotted.split(".")
        node: Any = out
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            value = node.get(parts[-1])
            if isinstance(value, str) and value:
                node[parts[-1]] = resolve_relative(value, yaml_path)
    return out


def load_yaml_model(
    cls: type[M],
    path: str | Path,
    *,
    path_keys: Iterable[str] = (),
    overrides: Mapping[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> M:
    """Load a config file into ``cls``.

    Reads ``path`` (or takes its already read ``data``), resolves ``path_keys`` by the one rule,
    applies non-None ``overrides`` (command-line values, taken as given; a dotted key such as
    ``environment.confirm_users`` sets a nested one) and validates.
    """
    raw = load_yaml_mapping(path) if data is None else data
    resolved = resolve_path_keys(raw, path, path_keys)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, leaf = key.split(".")  # a dotted key sets a nested one (environment.x)
        node = resolved
        for part in parents:
            inner = node.get(part)
            node[part] = node = dict(inner) if isinstance(inner, dict) else {}
        node[leaf] = value
    return parse_model(cls, resolved, str(path))
