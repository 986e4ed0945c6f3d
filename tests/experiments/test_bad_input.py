"""Issue 29's bad inputs: each ends in one line and exit 2 with nothing written, or now works.

Fast: config validation happens before any model is asked; the one eval runs on the fake server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, schema_valid_reply
from memloop.testing.commands import eval_argv
from memloop.testing.paths import REPO

ENV = {"users": 3, "periods": 1, "questions": 1, "seed": 1}


def write(path: Path, data: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def evolve_yaml(root: Path, **over) -> dict:
    policy = write(root / "awi.yaml", "type: awi\n")
    data = {
        "experiment": "bad",
        "environment": {"procedural": ENV, "train_users": 1, "val_users": 1, "test_users": 1},
        "policy": str(policy),
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
    }
    data.update(over)
    return data


def refused(capsys, root: Path, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memloop: error: "), captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (root / "runs").exists() and not (root / "mlruns").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        # a 1-period environment asked for 50 periods: refused, not silently run on 1
        (
            {"environment": {"procedural": ENV, "train_users": 1, "periods": 50}},
            ["key 'environment.periods': 50", "users have 2 periods"],
        ),
        ({"cycles": True}, ["key 'cycles'", "expected a whole number, got True"]),
        ({"cycles": 1_000_000_000_000}, ["key 'cycles'", "less than or equal to 1000"]),
        ({"parallel_users": 0}, ["key 'parallel_users'", "greater than or equal to 1"]),
        ({"repeats": "2"}, ["key 'repeats'", "expected a whole number"]),
    ],
)
def test_evolve_yaml_values_are_bounded_where_read(tmp_path, capsys, over, words):
    path = write(tmp_path / "exp.yaml", evolve_yaml(tmp_path, **over))
    refused(capsys, tmp_path, ["evolve", str(path), "--no-progress"], str(path), *words)


def test_a_key_given_twice_is_refused_not_silently_overwritten(tmp_path, capsys):
    text = yaml.safe_dump(evolve_yaml(tmp_path, cycles=2)) + "cycles: 5\n"
    path = write(tmp_path / "exp.yaml", text)
    refused(capsys, tmp_path, ["evolve", str(path)], "duplicate key 'cycles'", "line ")


@pytest.mark.parametrize(
    ("grid", "words"),
    [
        (
            {"update_freq": [2, -4, 0]},
            ["key 'search_space.update_freq' value -4", "greater than or equal to 1"],
        ),
        (
            {"short_term_len": {"low": -1, "high": 4}},
            ["key 'search_space.short_term_len' value -1", "greater than or equal to 0"],
        ),
        ({"top_k": [30, 100000]}, ["key 'search_space.top_k' value 100000", "less than or equal"]),
    ],
)
def test_a_tune_grid_is_bounded_to_what_awe_accepts(tmp_path, capsys, grid, words):
    policy = write(tmp_path / "awe.yaml", "type: awe\n")
    data = {
        "environment": {"procedural": ENV, "val_users": 1, "test_users": 1},
        "policy": str(policy),
        "storage": f"sqlite:///{tmp_path}/mlruns/optuna.db",
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "out_dir": str(tmp_path / "runs"),
        "search_space": grid,
    }
    path = write(tmp_path / "tune.yaml", data)
    refused(capsys, tmp_path, ["tune", str(path), "--no-progress"], *words)


def test_a_closed_output_pipe_ends_quietly(tmp_path):
    """`memloop env validate FILE | head -1`: no BrokenPipeError traceback."""
    env = tmp_path / "env.json"
    save_items(generate_procedural(**ENV), env)
    read, write_end = os.pipe()
    os.close(read)  # the reader is gone before memloop writes its first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "memloop", "env", "validate", str(env)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_300_character_user_id_gets_a_bounded_folder(tmp_path, capsys):
    items = generate_procedural(users=1, periods=1, questions=1, seed=0)
    long_id = "user-" + "x" * 295
    items = [items[0].model_copy(update={"id": long_id})]
    save_items(items, tmp_path / "env.json")
    policy = REPO / "memloop/experiments/policies/native.yaml"
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        endpoint = write(tmp_path / "endpoint.yaml", f"model: fake\nbase_url: {fake.base_url}\n")
        argv = eval_argv(
            tmp_path / "env.json", policy, endpoint, tmp_path / "c.sqlite", tmp_path / "out"
        )
        assert main(argv) == 0, capsys.readouterr().err
    (user_dir,) = (tmp_path / "out" / "episodes").iterdir()
    assert len(user_dir.name) <= 100 and user_dir.name.startswith("user-xxx")
    assert (tmp_path / "out" / "metrics.json").is_file()


QUIET_PROBE = """
import sys
from memloop.core.settings import apply_offline_defaults, quiet_third_party_warnings
apply_offline_defaults()
if sys.argv[1] == "quiet":
    quiet_third_party_warnings()
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = optuna.storages.RDBStorage(f"sqlite:///{sys.argv[2]}/optuna.db", heartbeat_interval=60)
study = optuna.create_study(storage=storage, study_name="s")
study.ask()  # Optuna warns: a heartbeat outside Study.optimize
optuna.samplers.BruteForceSampler(seed=0)  # Optuna warns: experimental
import logging
import dspy  # noqa: F401  (its import sets the "dspy" logger to INFO, after memloop's setting)
logging.getLogger("dspy.clients.lm").warning("LM response was truncated")  # as DSPy logs it
"""


def test_third_party_warnings_stay_out_of_a_commands_output(tmp_path):
    """What memloop's command line sets up (core.settings) silences tune's library warnings."""

    def stderr(mode: str) -> str:
        folder = tmp_path / mode
        folder.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", QUIET_PROBE, mode, str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    loud = stderr("loud")  # the probe does trigger library warnings and DSPy's log line
    assert "Warning" in loud and "LM response was truncated" in loud
    assert stderr("quiet") == ""


def test_env_check_with_a_checker_that_answers_only_prose_is_refused(tmp_path, capsys):
    env = tmp_path / "env.json"
    save_items(generate_procedural(users=1, periods=1, questions=1, seed=0), env)
    with FakeOpenAIServer(reply="I think the user would like a cup of tea.") as fake:
        endpoint = write(tmp_path / "ep.yaml", f"model: fake\nbase_url: {fake.base_url}\n")
        code = main(["env", "check", str(env), "--endpoint", str(endpoint)])
    captured = capsys.readouterr()
    assert code == 2
    # stderr: the progress bar, then the one error line
    lines = [ln for ln in captured.err.strip().splitlines() if "sessions:" not in ln]
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert "never answered in the expected JSON form" in line and "measures nothing" in line


EXAMPLE = REPO / "examples" / "keyword_memory"
BROKEN_PLUGIN = """
import sys
sys.path.insert(0, {example!r})
from keyword_memory import KeywordMemory
from memloop.policies import Answer


class Broken(KeywordMemory):
    def {method}(self, *args, **kwargs):
        value = super().{method}(*args, **kwargs)
        return {broken}
"""


@pytest.mark.parametrize(
    ("method", "broken", "returned"),
    [
        ("respond", "42", "respond returned int"),
        ("answer", "{{'text': value.text}}", "answer returned dict (no text str)"),
        ("memory_view", "None", "memory_view returned None"),
        ("unwritten_messages", "-1", "unwritten_messages returned -1 (not a count)"),
        (
            "answer",
            "Answer(value.text, value.retrieved_memories, {{'answer': 'zzz'}}, None)"
            " if kwargs.get('schema') else value",
            "answer returned parsed that breaks the question's schema",
        ),
    ],
)
def test_a_plugin_returning_the_wrong_type_is_named_with_user_and_period(
    tmp_path, capsys, method, broken, returned
):
    source = BROKEN_PLUGIN.format(example=str(EXAMPLE), method=method, broken=broken)
    write(tmp_path / "broken.py", source.replace("{{", "{").replace("}}", "}"))
    policy = write(tmp_path / "policy.yaml", "type: broken.py:Broken\nname: broken\n")
    items = generate_procedural(users=1, periods=1, questions=1, seed=0)
    save_items(items, tmp_path / "env.json")
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        endpoint = write(tmp_path / "endpoint.yaml", f"model: fake\nbase_url: {fake.base_url}\n")
        argv = eval_argv(tmp_path / "env.json", policy, endpoint, tmp_path / "c.db", tmp_path / "o")
        code = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memloop")]
    assert code == 2 and len(err) == 1, err
    assert f"plug-in keyword-memory.{returned}" in err[0]  # the class's `name`
    assert err[0].endswith(f"for user {items[0].id}, period 0: run memloop policy check")
    assert not (tmp_path / "o" / "metrics.json").exists()


@pytest.fixture
def immutable_folder(tmp_path):
    """A folder even root cannot write into (chattr +i), removed again afterwards."""
    folder = tmp_path / "immutable"
    folder.mkdir()
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr!r}")
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("where", ["under a file", "immutable folder"])
def test_an_output_path_that_cannot_be_written_is_one_line(tmp_path, capsys, request, where):
    if where == "under a file":
        (tmp_path / "a-file").write_text("")
        target = tmp_path / "a-file" / "out.json"
        words = ["a part of the path is a file"]  # said for ENOTDIR and EEXIST alike
    else:
        target = request.getfixturevalue("immutable_folder") / "out.json"
        words = ["not permitted", "immutable"]
    env = tmp_path / "env.json"
    save_items(generate_procedural(users=1, periods=1, questions=1, seed=0), env)
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        endpoint = write(tmp_path / "ep.yaml", f"model: fake\nbase_url: {fake.base_url}\n")
        code = main(["env", "check", str(env), "--endpoint", str(endpoint), "--json", str(target)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memloop")]
    assert code == 2 and len(lines) == 1, lines
    assert str(target.parent) in lines[0] or str(target) in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
