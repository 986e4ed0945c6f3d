"""Setting edits (issue 56, point 3): the edits evolver changes a policy option that shapes
writing (`verbatim`, `adapter`, ...) as it changes a sentence, through the prompts' SETTINGS_KEY
text, which build_policy applies to the policy's config."""

from __future__ import annotations

import json

import pytest

from memloop.core.errors import UserError
from memloop.feedback import write_failures as wf
from memloop.optimize.config import EvolveConfig, load_config
from memloop.optimize.evolvers.edits import EditsEvolver
from memloop.policies import build_policy
from memloop.policies.config import (
    SETTINGS_KEY,
    AWIConfig,
    parse_settings,
    settings_text,
    split_settings,
)
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles
from memloop.testing.commands import write_small_evolve


def test_settings_are_key_value_lines_that_build_policy_applies(tmp_path):
    text = settings_text({"verbatim": "user+edits", "adapter": "chat"})
    assert text == "adapter: chat\nverbatim: user+edits"
    assert parse_settings(text, "w") == {"adapter": "chat", "verbatim": "user+edits"}
    assert split_settings({"writer": "W.", SETTINGS_KEY: text}) == (
        {"writer": "W."},
        {"adapter": "chat", "verbatim": "user+edits"},
    )
    with pytest.raises(UserError, match="is not `key: value` lines"):
        parse_settings("- a list", "w")
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint

    client = ChatClient(Endpoint(model="m", base_url="http://127.0.0.1:9"))  # never called
    policy = build_policy(AWIConfig(), client, tmp_path, prompts={SETTINGS_KEY: "verbatim: user"})
    assert policy.config.verbatim == "user"
    assert policy.prompts() == build_policy(AWIConfig(), client, tmp_path / "b").prompts()
    with pytest.raises(UserError, match="top_k"):
        build_policy(AWIConfig(), client, tmp_path, prompts={SETTINGS_KEY: "top_k: 3"})


def test_setting_edits_are_ranked_by_the_failures_they_address():
    evolver = EditsEvolver(
        client=None, setting_edits={"adapter": ["chat"], "verbatim": ["user", "user+edits"]}
    )
    cands = evolver.setting_candidates("verbatim: user", {wf.NEVER_WRITTEN: 4})
    assert [c.edit for c in cands] == ["set verbatim: user+edits", "set adapter: chat"]
    assert cands[0].text == "verbatim: user+edits"
    assert cands[0].addresses == {wf.NEVER_WRITTEN: 4}
    assert cands[0].changes == ["set verbatim: user+edits (was 'user')"]
    assert cands[1].text == "adapter: chat\nverbatim: user"
    assert cands[1].changes == ["set adapter: chat (was the policy's own)"]


def test_an_evolve_run_screens_a_setting_edit_on_the_real_policy(tmp_path):
    """AWI itself (not a scripted stand-in) on the fake endpoint: the step screens `set
    verbatim: user` by replay beside the sentence edits, and records it like them."""
    from memloop.optimize.evolve import run_evolve

    path = write_small_evolve(
        tmp_path,
        "settings",
        (2, 1, 1),
        cycles=2,
        evolvers=["edits"],
        settings={"edits": {"setting_edits": {"verbatim": ["user"]}, "max_examples": 0}},
    )
    config = load_config(path, EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        (outcome,) = run_evolve(
            config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.sqlite")
        )
    step = json.loads((outcome.run_dir / "cycle_00" / "evolve.json").read_text())
    lines = step["changes"][SETTINGS_KEY]
    (tried,) = [line for line in lines if line.startswith("candidates: ")]
    assert tried.startswith("candidates: set verbatim: user [set verbatim: user (was the policy's")
    # its replay ran AWI with verbatim: user: the user's messages stored as said
    views = [
        json.loads(p.read_text())["probes"].get("memory_view", "")
        for p in (outcome.run_dir / "cycle_00" / "screen").rglob("record.json")
    ]
    assert any(v.startswith("Memory (label: value):\nsaid_1: ") for v in views)
    assert not any("said_1" in v for v in _cycle_views(outcome))  # the seed stored none


def _cycle_views(outcome) -> list[str]:
    return [
        json.loads(p.read_text())["probes"].get("memory_view", "")
        for p in (outcome.run_dir / "cycle_00" / "episodes").rglob("record.json")
    ]


def test_a_setting_edit_the_policy_does_not_take_is_refused_before_the_run(tmp_path):
    from memloop.optimize.evolve import run_evolve

    path = write_small_evolve(
        tmp_path,
        "settings-bad",
        (2, 1, 1),
        evolvers=["edits"],
        settings={"edits": {"setting_edits": {"top_k": [5]}}},
    )
    config = load_config(path, EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        with pytest.raises(UserError, match=r"setting_edits\.top_k' value 5"):
            run_evolve(
                config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.sqlite")
            )
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("cycle_00"))


def test_a_prompt_file_with_settings_starts_a_policy_with_them_and_only_text_exports_keep_them(
    tmp_path,
):
    from memloop.policies.prompt_files import render_text
    from memloop.results.export import write_export
    from memloop.runs.inputs import load_policy
    from memloop.testing.exports import made_export

    (tmp_path / "p.txt").write_text(
        render_text({"writer": "Write facts.", SETTINGS_KEY: "verbatim: user"})
    )
    (tmp_path / "awi.yaml").write_text("type: awi\nprompts_from: p.txt\n")
    config = load_policy(tmp_path / "awi.yaml")
    assert (config.verbatim, config.prompts, config.display_name) == (
        "user",
        {"writer": "Write facts."},
        "awi-2-4-verbatim",
    )
    (tmp_path / "named.yaml").write_text("type: awi\nname: mine\nprompts_from: p.txt\n")
    assert load_policy(tmp_path / "named.yaml").display_name == "mine"
    exported = made_export(
        "awi",
        cycle=2,
        rule="r",
        prompts={"writer": "Write facts.", SETTINGS_KEY: "verbatim: user"},
        agent={},
    )
    with pytest.raises(UserError, match="cycle 2's prompts carry policy settings"):
        write_export(exported, "dspy", tmp_path / "out.json")
    (out,) = write_export(exported, "text", tmp_path / "out.txt")
    assert "=== @settings ===\nverbatim: user" in out.read_text()
