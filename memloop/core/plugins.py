"""Loading code a YAML file names: `package.module:Name`, `path/to/file.py:Name`, entry points.

The one loader of memloop's plug-ins (policies, optimizers). Naming code in a YAML file runs it:
the module is imported when the file is read.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
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
