"""Old module paths that keep working after a module moved (an import alias, not a copy).

`alias(old, new)` makes `import old`, `from old import name` and a YAML target `old:Class` give
the module `new` itself (the same object, so a monkeypatch or an `isinstance` on either name sees
the other). memloop's own code imports the new paths only (tests/test_architecture.py checks
it); the aliases are for plug-ins, scripts and experiment files written before a move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

_MOVED: dict[str, str] = {}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        # the import system returns whatever sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(_MOVED[module.__name__])


_FINDER = _AliasFinder()


def alias(moved: dict[str, str]) -> None:
    """Make each old dotted module name of `moved` an alias of its new one."""
    _MOVED.update(moved)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def moved() -> dict[str, str]:
    """{old module name: new module name} of every alias made so far."""
    return dict(_MOVED)
