"""Loading code a YAML file names: `package.module:Name`, `path/to/file.py:Name`, entry points.

The one loader of memloop's plug-ins (policies, optimizers). Naming code in a YAML file runs it:
the module is imported when the file is read.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import file_sha256


def installed(group: str) -> dict[str, str]:
    """{short name: target} that installed packages register in the entry-point `group`."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def plugin_file(module: str, base_dir: Path | None, where: str) -> Path:
    """The absolute path of a `path/to/file.py` plug-in module (relative to `base_dir`).

    Raises a one-line UserError, prefixed with `where`, when there is no such file.
    """
    path = Path(module)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise UserError(
            f"{where}: no such file {path} (a path in a YAML file is relative to that file's "
            "folder)"
        )
    return path.resolve()


class MissingName(LookupError):
    """The module imports but has no such name."""


def import_target(target: str) -> Any:
    """The object `module:Name` or `/path/file.py:Name` names.

    Raises whatever importing the user's code raises, and MissingName for a missing name.
    """
    module_name, _, attr = target.rpartition(":")
    if module_name.endswith(".py"):
        module = module_from_file(Path(module_name))
    else:
        module = importlib.import_module(module_name)
    found = getattr(module, attr, None)
    if found is None:
        raise MissingName(f"{module_name} has no attribute {attr}")
    return found


def module_from_file(path: Path):
    """The module of a plug-in file, imported once per file content."""
    name = f"memloop_plugin_{file_sha256(path)[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# ---------------------------------------------------------------- a plug-in's failing call


def is_plugin(obj: Any) -> bool:
    """Whether `obj` is a user's plug-in: its class comes from outside the memloop package.

    A plug-in's exception is the plug-in's bug, told in one line (`call`); one of memloop's own
    classes keeps its traceback.
    """
    module = getattr(type(obj), "__module__", "") or ""
    return module != "memloop" and not module.startswith("memloop.")


def plugin_label(obj: Any) -> str:
    """The name a plug-in goes by in messages: its `name` (a non-empty text), else its class's."""
    try:
        name = getattr(obj, "name", None)
    except Exception:  # a `name` property of the plug-in's that raises
        name = None
    return name if isinstance(name, str) and name else type(obj).__name__


def accepts_keyword(func: Any, name: str) -> bool:
    """Whether `func` takes the keyword argument `name` (by name or through **kwargs).

    A newer optional keyword of a contract (e.g. `Policy.answer(top_logprobs=)`) is passed to a
    plug-in only when it takes it, so plug-ins written before it keep working.
    """
    import inspect

    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in params
    )


def call(obj: Any, method: str, *args: Any, where: str = "", **kwargs: Any) -> Any:
    """`obj.method(*args, **kwargs)`; a plug-in's exception becomes one line (a UserError).

    The line: ``plug-in NAME.METHOD raised RuntimeError('boom')`` + `where` (e.g. " for user U,
    period P") + the plug-in's function, file and line where it was raised (``in ingest, at
    my_policy.py:12``: a method that calls another names the one that raised). A UserError,
    Ctrl-C and the exceptions of memloop's own classes pass as they are.
    """
    try:
        return getattr(obj, method)(*args, **kwargs)
    except UserError:
        raise
    except Exception as exc:
        if not is_plugin(obj):
            raise
        raise UserError(
            f"plug-in {plugin_label(obj)}.{method} raised {_short_repr(exc)}{where}"
            f"{_raised_at(obj, exc)}"
        ) from exc


def _short_repr(exc: BaseException, limit: int = 200) -> str:
    try:
        text = repr(exc)
    except Exception:  # an exception whose __repr__ fails
        text = type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _raised_at(obj: Any, exc: BaseException) -> str:
    """` (in FUNCTION, at file.py:LINE)`: where in the plug-in's module it was raised.

    The last line of that module the traceback went through, and the function it is in.
    """
    module = sys.modules.get(type(obj).__module__)
    source = getattr(module, "__file__", None)
    if not source:
        return ""
    found: tuple[str, int] | None = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == source:
            found = (tb.tb_frame.f_code.co_name, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return ""
    # the plug-in's own method it was raised in: a respond that calls its ingest names ingest
    name, line = found
    return f" (in {name}, at {Path(source).name}:{line})"


def prompts_problem(value: Any) -> str | None:
    """What is wrong with the value of a policy's `prompts()`, or None for a dict of str to str."""
    if not isinstance(value, dict):
        kind = "None" if value is None else type(value).__name__
        return f"returned {kind}, not a dict of prompt name (str) to prompt text (str)"
    for key, text in value.items():
        if not isinstance(key, str) or not isinstance(text, str):
            return (
                f"returned a dict with {key!r:.60}: {type(text).__name__}, not a dict of prompt "
                "name (str) to prompt text (str)"
            )
    return None


def checked_prompts(obj: Any, where: str = "") -> dict[str, str]:
    """`obj.prompts()` through `call`; anything but a dict of str to str is one line naming it."""
    prompts = call(obj, "prompts", where=where)
    problem = prompts_problem(prompts)
    if problem is not None:
        raise UserError(
            f"plug-in {plugin_label(obj)}.prompts {problem}{where}: run memloop policy check"
        )
    return prompts


class Registry:
    """One kind of plug-in by name (policy types; optimizers), under one precedence rule.

    A name resolves to the first of:
    1. a built-in (`builtin`: {name: (kind, "package.module:Class")}); nothing else can take a
       built-in's name: `register` refuses it and an entry point with it is ignored;
    2. a class registered in this process with `register(name, cls)`;
    3. an installed package's entry point in `group` (value "package.module:Class");
    4. the name itself, when it is "package.module:Class" or "path/to/file.py:Class".

    `kind_of(cls)` tells the kind a class declares by its members (None: not a plug-in of this
    registry); built-ins declare theirs in the table.
    """

    def __init__(
        self,
        group: str,
        builtin: dict[str, tuple[str, str]],
        kind_of: Callable[[type], str | None],
        not_a_plugin: str = "{name} is not a plug-in of {group}",
    ):
        self.group = group
        self.builtin = dict(builtin)
        self.kind_of = kind_of
        self.not_a_plugin = not_a_plugin  # register's refusal of a class of no kind
        self.registered: dict[str, type] = {}

    def register(self, name: str, cls: type) -> None:
        """Make `cls` available by `name` in YAML files (refused: a built-in's name)."""
        if not isinstance(cls, type):
            raise TypeError(f"register({name!r}, ...): give the class, not {type(cls).__name__}")
        if name in self.builtin:
            raise ValueError(f"register({name!r}, ...): a built-in's name; choose another")
        if self.kind_of(cls) is None:
            raise TypeError(self.not_a_plugin.format(name=cls.__name__, group=self.group))
        self.registered[name] = cls

    def installed(self) -> dict[str, str]:
        """{name: target} of the installed packages' entry points, without built-in names."""
        return {n: t for n, t in installed(self.group).items() if n not in self.builtin}

    def names(self, kind: str | None = None) -> list[str]:
        """The names known without importing a plug-in (of `kind`, or all), in rule order."""
        known = [n for n, (k, _) in self.builtin.items() if kind in (None, k)]
        known += [
            n
            for n, cls in self.registered.items()
            if kind in (None, self.kind_of(cls)) and n not in known
        ]
        known += [n for n in self.installed() if n not in known]
        return known

    def lookup(self, name: str) -> type | str | None:
        """The class registered as `name`, or the target `name` stands for (None: unknown)."""
        if name in self.builtin:
            return self.builtin[name][1]
        if name in self.registered:
            return self.registered[name]
        return self.installed().get(name) or (name if ":" in name else None)
