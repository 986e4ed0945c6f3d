"""Issue 59, point 4: a hint a command prints can be followed with flags alone (no copied YAML).

evolve and tune take `--confirm-users N` (a procedural environment grows to have them) and
`--tracking-uri`; `--model` takes `--logprobs` (the JSON-read note names it); the hints name the
flags."""

from __future__ import annotations

import pytest

from memloop.core.errors import UserError
from memloop.optimize.config import EvolveConfig, TuneConfig, load_config
from memloop.testing.commands import write_small_evolve, write_small_tune


def test_confirm_users_from_the_command_line_grows_a_procedural_environment(tmp_path, capsys):
    path = write_small_evolve(tmp_path, "hint", (2, 1, 1))  # 4 procedural users
    config = load_config(path, EvolveConfig, {"environment.confirm_users": 26})
    assert config.environment.confirm_users == 26
    assert config.environment.procedural.users == 2 + 1 + 1 + 26
    assert "environment.procedural.users: 4 -> 30" in capsys.readouterr().out
    # the YAML's own value stands without the flag
    assert load_config(path, EvolveConfig, {"environment.confirm_users": None}).environment == (
        load_config(path, EvolveConfig).environment
    )


def test_null_control_without_confirmation_users_is_fixed_by_the_flag(tmp_path):
    path = write_small_evolve(tmp_path, "hint", (2, 1, 1), null_control=True)
    with pytest.raises(UserError, match=r"confirm_users \(or give --confirm-users N\)"):
        load_config(path, EvolveConfig)
    config = load_config(path, EvolveConfig, {"environment.confirm_users": 6})
    assert config.null_control and config.environment.confirm_users == 6


def test_tracking_uri_from_the_command_line_moves_the_optuna_store_beside_it(tmp_path):
    path = write_small_tune(tmp_path, "hint")
    uri = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    config = load_config(path, TuneConfig, {"tracking_uri": uri})
    assert config.tracking_uri == uri
    assert config.storage == f"sqlite:///{tmp_path}/elsewhere/optuna.db"


def test_the_evolve_command_takes_the_flags(tmp_path, capsys):
    from memloop.experiments.cli import main

    path = write_small_evolve(tmp_path, "hint", (2, 1, 1))
    assert main(["evolve", str(path), "--confirm-users", "-1"]) == 2
    assert "--confirm-users must be at least 0 (got -1)" in capsys.readouterr().err
    assert main(["tune", str(write_small_tune(tmp_path, "t")), "--logprobs"]) == 2
    assert "--logprobs goes with --model: give --model NAME too" in capsys.readouterr().err


def test_logprobs_with_model_declares_them_and_the_json_read_note_names_the_flag():
    from memloop.experiments.commands.options import model_endpoint
    from memloop.feedback.probes import ProbeSettings, probes_for

    url = "http://127.0.0.1:8000/v1"
    assert model_endpoint("m", url, None, logprobs=True).returns_logprobs
    assert not model_endpoint("m", url, None).returns_logprobs
    _, note = probes_for(ProbeSettings(), returns_logprobs=False)
    assert note is not None and "--logprobs with --model" in note
