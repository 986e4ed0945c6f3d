"""The catalogue of user-state variables for the procedural generator, loaded from catalogue.yaml.

The data (life domains, each with variables whose values carry first-person renderings and one line
of advice tailored to the value) lives in the package data file ``catalogue.yaml`` beside this
module; this module holds the dataclasses, the loader and its validation. The file is read once at
import through ``importlib.resources`` (so an installed wheel works too), and the sha256 of its
bytes, ``CATALOGUE_SHA256``, goes into a procedural environment's description: editing the
catalogue changes every run key built on it.

Renderings are written so each one reveals its own variable's value and no other variable of the
catalogue; the catalogue tests check that no rendering appears inside another.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from memloop.core.config import UniqueKeyLoader, yaml_problem
from memloop.core.errors import UserError

CATALOGUE_RESOURCE = "catalogue.yaml"
"""The catalogue's file name inside the `memloop.environment` package."""

_VARIABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
_VALUE_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")


@dataclass(frozen=True)
class Value:
    """One choice of a variable: its data.json string, first-person renderings and its advice."""

    name: str
    renderings: tuple[str, ...]
    advice: str

    @property
    def label(self) -> str:
        """The value as words, e.g. 'public transit' for 'public_transit'."""
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class Variable:
    """A state variable of one life domain.

    `label` names it in events ("work schedule"), `topic` names it in questions from the user's
    side ("the hours I work").
    """

    name: str
    domain: str
    label: str
    topic: str
    values: tuple[Value, ...]

    def value(self, name: str) -> Value:
        """The value called `name` (KeyError if the variable has no such value)."""
        for value in self.values:
            if value.name == name:
                return value
        raise KeyError(f"{self.name} has no value {name!r}")

    @property
    def value_names(self) -> list[str]:
        """The value strings in catalogue order."""
        return [value.name for value in self.values]


@dataclass(frozen=True)
class Catalogue:
    """A loaded and validated catalogue: its domains in file order and the sha256 of its bytes."""

    domains: dict[str, tuple[Variable, ...]]
    sha256: str
    source: str

    @property
    def variables(self) -> dict[str, Variable]:
        """Variable name -> variable, across all domains, in catalogue order."""
        return {var.name: var for group in self.domains.values() for var in group}


# --- loading and validation ----------------------------------------------------------------------


def load_catalogue(path: str | Path | None = None) -> Catalogue:
    """Read, validate and hash a catalogue file (the packaged ``catalogue.yaml`` by default).

    `path` names another file in the same format (tests, or a catalogue being edited). Raises
    UserError naming the file and the entry (domain, variable, value) at fault.
    """
    if path is None:
        resource = resources.files(__package__ or "memloop.environment") / CATALOGUE_RESOURCE
        source = str(resource)
        try:
            data = resource.read_bytes()
        except OSError as exc:
            raise UserError(f"{source}: cannot read the catalogue ({exc})") from None
    else:
        source = str(path)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UserError(f"{source}: cannot read the catalogue ({exc})") from None
    return parse_catalogue(data, source)


def parse_catalogue(data: bytes, source: str) -> Catalogue:
    """Validate the bytes of a catalogue file; `source` names it in error messages."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{source}: the catalogue is not UTF-8 text ({exc})") from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: not valid YAML ({yaml_problem(exc)})") from None
    top = _mapping(raw, {"domains"}, source, "the top level")
    domains: dict[str, tuple[Variable, ...]] = {}
    variable_domain: dict[str, str] = {}
    for i, raw_domain in enumerate(_list(top["domains"], 1, source, "domains")):
        where = f"domains[{i}]"
        entry = _mapping(raw_domain, {"domain", "variables"}, source, where)
        domain = _text(entry["domain"], source, f"{where}.domain")
        where = f"domain {domain!r}"
        if domain in domains:
            raise UserError(f"{source}: {where} is given twice")
        variables = []
        for j, raw_var in enumerate(_list(entry["variables"], 1, source, f"{where}: variables")):
            var = _variable(raw_var, domain, source, f"{where}, variables[{j}]")
            if var.name in variable_domain:
                raise UserError(
                    f"{source}: {where}, variable {var.name!r}: the name is already used in "
                    f"domain {variable_domain[var.name]!r} (variable names are unique)"
                )
            variable_domain[var.name] = domain
            variables.append(var)
        domains[domain] = tuple(variables)
    return Catalogue(domains=domains, sha256=hashlib.sha256(data).hexdigest(), source=source)


def _variable(raw: Any, domain: str, source: str, where: str) -> Variable:
    entry = _mapping(raw, {"name", "label", "topic", "values"}, source, where)
    name = _name(entry["name"], _VARIABLE_NAME, source, f"{where}.name")
    where = f"domain {domain!r}, variable {name!r}"
    label = _text(entry["label"], source, f"{where}: label")
    topic = _text(entry["topic"], source, f"{where}: topic")
    values: list[Value] = []
    for k, raw_value in enumerate(_list(entry["values"], 2, source, f"{where}: values")):
        value = _value(raw_value, source, f"{where}, values[{k}]", where)
        if any(value.name == other.name for other in values):
            raise UserError(f"{source}: {where}: value {value.name!r} is given twice")
        values.append(value)
    return Variable(name=name, domain=domain, label=label, topic=topic, values=tuple(values))


def _value(raw: Any, source: str, where: str, variable_where: str) -> Value:
    entry = _mapping(raw, {"name", "renderings", "advice"}, source, where)
    name = _name(entry["name"], _VALUE_NAME, source, f"{where}.name")
    where = f"{variable_where}, value {name!r}"
    renderings = [
        _text(text, source, f"{where}: renderings[{n}]")
        for n, text in enumerate(_list(entry["renderings"], 1, source, f"{where}: renderings"))
    ]
    if len(set(renderings)) != len(renderings):
        raise UserError(f"{source}: {where}: a rendering is given twice")
    advice = _text(entry["advice"], source, f"{where}: advice")
    return Value(name=name, renderings=tuple(renderings), advice=advice)


def _mapping(raw: Any, keys: set[str], source: str, where: str) -> dict[str, Any]:
    expected = ", ".join(sorted(keys))
    if not isinstance(raw, dict):
        raise UserError(f"{source}: {where}: expected a mapping with keys {expected}")
    missing = sorted(keys - set(raw))
    unknown = sorted(str(key) for key in set(raw) - keys)
    if missing:
        raise UserError(f"{source}: {where}: missing key {missing[0]!r} (expected {expected})")
    if unknown:
        raise UserError(f"{source}: {where}: unknown key {unknown[0]!r} (expected {expected})")
    return raw


def _list(raw: Any, minimum: int, source: str, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise UserError(f"{source}: {where}: expected a list")
    if len(raw) < minimum:
        raise UserError(f"{source}: {where}: needs at least {minimum}, got {len(raw)}")
    return raw


def _text(raw: Any, source: str, where: str) -> str:
    if not isinstance(raw, str):
        raise UserError(f"{source}: {where}: expected text, got {raw!r}")
    if not raw.strip():
        raise UserError(f"{source}: {where}: is empty")
    if raw != raw.strip() or "\n" in raw:
        raise UserError(f"{source}: {where}: must be one line without surrounding spaces")
    return raw


def _name(raw: Any, pattern: re.Pattern[str], source: str, where: str) -> str:
    name = _text(raw, source, where)
    if not pattern.fullmatch(name):
        raise UserError(
            f"{source}: {where}: {name!r} is not a snake_case name (lower-case letters, digits, _)"
        )
    return name


# --- the packaged catalogue ----------------------------------------------------------------------

CATALOGUE: Catalogue = load_catalogue()
"""The packaged catalogue, loaded and validated once at import."""

CATALOGUE_SHA256: str = CATALOGUE.sha256
"""The hex sha256 of the bytes of the packaged ``catalogue.yaml``."""

DOMAINS: dict[str, tuple[Variable, ...]] = CATALOGUE.domains
"""Domain name -> its variables, in catalogue order."""

VARIABLES: dict[str, Variable] = CATALOGUE.variables
"""Variable name -> variable, across all domains."""


def catalogue_sha256() -> str:
    """The hex sha256 of the packaged catalogue file's bytes (`CATALOGUE_SHA256`)."""
    return CATALOGUE_SHA256


def variable(name: str) -> Variable:
    """The catalogue variable called `name` (KeyError if unknown)."""
    return VARIABLES[name]


def variables_with_values(minimum: int) -> list[Variable]:
    """Variables offering at least `minimum` values, sorted by name (the sampling pool)."""
    return sorted(
        (var for var in VARIABLES.values() if len(var.values) >= minimum), key=lambda var: var.name
    )


def max_values_per_variable() -> int:
    """The largest number of values any catalogue variable offers."""
    return max(len(var.values) for var in VARIABLES.values())
