"""A run's spec (inspect_ai style): what was run and how, so a result can be traced and rebuilt.

It records the components, data, versions and code revision. It never holds a secret.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("memloop", "dspy", "mem0ai", "optuna", "mlflow", "openai", "xllamacpp")


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def run_spec(**components: Any) -> dict[str, Any]:
    from memloop.feedback.records import SCORER_VERSION

    return {
        "components": components,
        "scorer_version": SCORER_VERSION,
        "versions": versions(),
        "git_revision": git_revision(),
    }
