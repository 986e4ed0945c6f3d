"""Command lines the tests drive memloop through."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def all_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("memloop",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command path, parser) of `parser` (the program's) and every sub-command, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, (*path, name))


def small_evolve(
    root: Path,
    experiment: str,
    users: tuple[int, int, int],
    *,
    periods: int = 2,
    questions: int = 2,
    **settings: Any,
) -> Any:
    """The EvolveConfig of `write_small_evolve`'s file (the same arguments)."""
    from memloop.optimize.config import EvolveConfig, load_config

    path = write_small_evolve(
        root, experiment, users, periods=periods, questions=questions, **settings
    )
    return load_config(path, EvolveConfig)


def write_small_evolve(
    root: Path,
    experiment: str,
    users: tuple[int, int, int],
    *,
    periods: int = 2,
    questions: int = 2,
    confirm: int = 0,
    **settings: Any,
) -> Path:
    """An evolve YAML of an AWI policy on a small procedural environment, written under `root`.

    `users`: (train, val, test), each user `periods` x `questions` (procedural seed 1), and
    `confirm` confirmation users after them;
    feedback mode complete, the reflective evolver; MLflow on sqlite and the run folders under
    `root`; `settings` adds or replaces keys of the evolve YAML (e.g. evolvers, cycles), and a
    setting of None drops the key (e.g. `evolvers=None` for a search that evolves by itself).
    Returns root/exp.yaml.
    """
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    (root / "awi.yaml").write_text("type: awi\n")
    train, val, test = users
    data = {
        "experiment": experiment,
        "environment": {
            "procedural": {
                "users": sum(users) + confirm,
                "periods": periods,
                "questions": questions,
                "seed": 1,
            },
            "train_users": train,
            "val_users": val,
            "test_users": test,
            **({"confirm_users": confirm} if confirm else {}),
        },
        "policy": str(root / "awi.yaml"),
        "feedback_modes": ["complete"],
        "evolvers": ["reflective"],
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
        **settings,
    }
    data = {k: v for k, v in data.items() if v is not None}
    (root / "exp.yaml").write_text(yaml.safe_dump(data))
    return root / "exp.yaml"


def eval_argv(
    env: str | Path, policy: str | Path, endpoint: str | Path, cache: str | Path, out: str | Path
) -> list[str]:
    """`memloop eval` arguments (without the program name) for these files."""
    return [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(policy),
        "--endpoint",
        str(endpoint),
        "--cache",
        str(cache),
        "--out",
        str(out),
    ]


# A `memloop tune` worker in its own process: the fake endpoint for every role, the scripted
# policy slowed by `delay` seconds per reply (so a test can kill it while a trial runs).
def write_small_tune(root: Path, study: str, **settings: Any) -> Path:
    """A tune YAML of an AWI policy on 2 procedural users (1 validation, 1 test), under `root`.

    Each user 1 period x 1 question (seed 1); 1 trial over update_freq [2, 4]; `settings` adds
    or replaces keys of the tune YAML (e.g. trials, search_space, endpoints, tracking_uri).
    The stores and folders are the command's defaults, relative to where it runs, unless
    `settings` says. Returns root/tune.yaml.
    """
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    (root / "awi.yaml").write_text("type: awi\n")
    data = {
        "study": study,
        "environment": {
            "procedural": {"users": 2, "periods": 1, "questions": 1, "seed": 1},
            "val_users": 1,
            "test_users": 1,
        },
        "policy": str(root / "awi.yaml"),
        "trials": 1,
        "search_space": {"update_freq": [2, 4]},
        **settings,
    }
    (root / "tune.yaml").write_text(yaml.safe_dump(data))
    return root / "tune.yaml"


_TUNE_WORKER = """
import sys, time
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.optimize.config import TuneConfig, load_config
from memloop.optimize.tune import format_outcome, run_tune
from memloop.testing import scripted_builder
from memloop.testing.policies import ScriptedPolicy
delay = float(sys.argv[3])
orig = ScriptedPolicy.respond
def slow(self, msg):
    time.sleep(delay)
    return orig(self, msg)
ScriptedPolicy.respond = slow
config = load_config(sys.argv[1], TuneConfig)
client = ChatClient(Endpoint(model="m", base_url=sys.argv[2]), cache=sys.argv[4])
roles = RoleClients(client, client, client, client)
print(format_outcome(run_tune(config, progress=False, clients=roles, builder=scripted_builder())))
"""


def tune_worker(
    config: Path, base_url: str, delay: float, cache: Path, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """Start a tune worker on `config` against the fake endpoint at `base_url`."""
    return subprocess.Popen(
        [sys.executable, "-c", _TUNE_WORKER, str(config), base_url, str(delay), str(cache)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
