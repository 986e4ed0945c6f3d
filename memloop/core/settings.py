"""Process-wide offline defaults for third-party libraries, set before they are imported."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
UI_PORT = 5000  # `memloop ui`'s default port (tune's trial notes link runs there)
SHIPPED_FILES = Path(__file__).resolve().parents[1] / "experiments"
"""The YAML files memloop ships (endpoints, policies, environments, experiments)."""
TRACES_ENV = "MEMLOOP_TRACES"
"""`MEMLOOP_TRACES=0` logs no episode traces to MLflow (each span is one store transaction: about
0.1 s per session trace on a local sqlite store)."""


def traces_enabled() -> bool:
    """Whether evolve and eval log each user's sessions as MLflow traces (default: yes)."""
    import os

    return os.environ.get(TRACES_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


"""The MLflow store every command uses unless told otherwise (relative to the working folder)."""


def cache_root() -> Path:
    """The user cache folder of memloop (model files, response cache).

    ``$MEMLOOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/memloop``, else ``~/.cache/memloop``.
    """
    explicit = os.environ.get("MEMLOOP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memloop"


def apply_offline_defaults() -> None:
    """Keep litellm, mem0, MLflow, DSPy and Hugging Face from phoning home or writing to $HOME.

    Only sets variables the user has not set; must run before those libraries are imported.
    """
    root = cache_root()
    defaults = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MEM0_TELEMETRY": "False",
        "MEM0_DIR": str(root / "mem0"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # compare and quickstart read small artifacts: no "Downloading artifacts" bar for each
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DO_NOT_TRACK": "true",
        "DSPY_CACHEDIR": str(root / "dspy"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


# libraries whose own warnings (deprecations inside MLflow's SQLAlchemy store, Optuna's
# experimental features, ...) are not the user's to act on
THIRD_PARTY = (
    "alembic",
    "dspy",
    "gepa",
    "huggingface_hub",
    "litellm",
    "mem0",
    "mlflow",
    "optuna",
    "pydantic",
    "sqlalchemy",
    "torch",
    "transformers",
)


def quiet_third_party_warnings() -> None:
    """Keep third-party libraries' warnings out of a command's output.

    Not when the user chose warnings themselves (`python -W ...` or PYTHONWARNINGS).
    """
    import sys
    import warnings

    if sys.warnoptions:
        return
    warnings.filterwarnings("ignore", module=rf"({'|'.join(THIRD_PARTY)})(\.|$)")
    warnings.filterwarnings("ignore", message=r".* is experimental \(supported from")
    import logging

    # DSPy logs "LM response was truncated" when a reply reaches max_tokens; where memloop uses
    # the reply, a cut one fails to parse and is counted (json_errors) or rejected there
    logging.getLogger("dspy").setLevel(logging.ERROR)
    # DSPy's import sets its own logger back to INFO; a child's own level stays
    logging.getLogger("dspy.clients.lm").setLevel(logging.ERROR)


def import_keeping_warning_filters(module: str) -> Any:
    """Import `module` without letting its import change the process's warning filters.

    mem0's client turns every DeprecationWarning on, process-wide, when it is imported
    (`warnings.filterwarnings("default", category=DeprecationWarning)` in mem0/client/main.py):
    after it, SQLAlchemy's deprecation warnings from MLflow's schema migrations were printed by
    every AWE evolve and tune. The filters are restored when the import ends.
    """
    import importlib
    import warnings

    with warnings.catch_warnings():
        return importlib.import_module(module)


PROGRAM_GC_THRESHOLDS = (50_000, 20, 100)
"""The `memloop` program's garbage-collector thresholds (Python's default: 700, 10, 10).

A run keeps every user's records alive, and each full collection walks all of them: with 1,000
users the default thresholds cost about 0.2 ms more CPU per model call than with 256
(benchmarks/throughput.py: marginal 2.1 -> 1.9 ms from 256 to 1,000 users; peak memory +3%).
Set by the program (`experiments.cli.entry`), never on import: a library user keeps their own.
"""


def program_gc() -> None:
    """Apply PROGRAM_GC_THRESHOLDS (for the `memloop` program and the benchmarks that mirror it)."""
    import gc

    gc.set_threshold(*PROGRAM_GC_THRESHOLDS)


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """The library logger `name` shows errors only for the block, then its own level again."""
    quiet = logging.getLogger(name)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)
