"""A policy YAML's `prompts_from:`: a file `memloop export` wrote (text, mem0, DSPy) or a version of
MLflow's prompt registry starts a policy from those prompts, for `eval` on new users and as an
evolve seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.core.errors import UserError
from memloop.policies.programs import (
    AWI_WRITER_INSTRUCTIONS,
    AWEProgram,
    AWIProgram,
    save_program,
)
from memloop.policies.prompt_files import parse_text, read_prompt_file, render_text
from memloop.runs import tracker
from memloop.runs.inputs import load_policy

AWE_PROMPTS = {
    "fact_extraction": "Extract facts.\n\n=== not a header: indented text ===\nKeep dates.",
    "memory_update": "Reconcile.\n## looks like a section\nDone.",
}
WRITER = AWI_WRITER_INSTRUCTIONS + " Keep one label per fact and never guess a value."


def policy_yaml(folder: Path, body: str) -> Path:
    path = folder / "policy.yaml"
    path.write_text(body)
    return path


def test_the_text_format_reads_back_what_it_wrote():
    text = render_text(AWE_PROMPTS, ["# from run x", "# cycle 2"])
    assert parse_text(text, "t") == AWE_PROMPTS
    # a section's own blank lines are kept; only the separator before the next one goes
    assert parse_text("=== a ===\none\n\ntwo\n\n=== b ===\nthree\n", "t") == {
        "a": "one\n\ntwo",
        "b": "three",
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("just a prompt\n", "text before the first '=== name ==='"),
        ("# only a header\n", "no '=== name ===' section"),
        ("=== a ===\nx\n=== a ===\ny\n", "prompt 'a' given twice"),
    ],
)
def test_a_text_file_that_is_no_prompt_file_is_refused(text, needle):
    with pytest.raises(UserError) as info:
        parse_text(text, "f.txt")
    assert needle in str(info.value)


def test_dspy_and_mem0_files_give_their_prompts(tmp_path):
    save_program(AWEProgram(**AWE_PROMPTS), tmp_path / "awe.json")
    save_program(AWIProgram(writer=WRITER), tmp_path / "awi.json")
    mem0 = {
        "version": "v1.1",
        "custom_fact_extraction_prompt": AWE_PROMPTS["fact_extraction"],
        "custom_update_memory_prompt": AWE_PROMPTS["memory_update"],
    }
    (tmp_path / "mem0.json").write_text(json.dumps(mem0))
    assert read_prompt_file(tmp_path / "awe.json") == AWE_PROMPTS
    assert read_prompt_file(tmp_path / "awi.json") == {"writer": WRITER}
    assert read_prompt_file(tmp_path / "mem0.json") == AWE_PROMPTS


def test_a_policy_yaml_starts_from_a_file_relative_to_its_folder(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "evolved.txt").write_text(render_text({"writer": WRITER}, ["# x"]))
    config = load_policy(policy_yaml(tmp_path / "p", "type: awi\nprompts_from: evolved.txt\n"))
    assert config.prompts == {"writer": WRITER}
    assert config.model_dump()["prompts"] == {"writer": WRITER}  # what the run identity holds


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("type: awi\nprompts_from: x.txt\nprompts: {writer: y}\n", "not both"),
        ("type: awi\nprompts_from: missing.txt\n", "missing.txt: no such file"),
        # issue 57: a folder and a pipe were "no such file" (and reading a pipe would wait)
        ("type: awi\nprompts_from: folder\n", "folder: is a folder, not a file"),
        ("type: awi\nprompts_from: pipe\n", "pipe: is not a regular file (a pipe"),
        ("type: awi\nprompts_from: 3\n", "expected a file or prompts:/NAME@ALIAS"),
        ("type: awi\nprompts_from: 'prompts:/a@b@c'\n", "expected prompts:/NAME@ALIAS"),
        ("type: examples/x.py:P\nprompts_from: x.txt\n", "built-in policies only"),
    ],
)
def test_bad_prompts_from_is_one_line(tmp_path, body, needle):
    import os

    (tmp_path / "x.txt").write_text("=== writer ===\nw\n")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UserError) as info:
        load_policy(policy_yaml(tmp_path, body), f"sqlite:///{tmp_path}/m.db")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_registry_versions_by_alias_and_number_on_a_real_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    mlc = tracker.client(uri)
    experiment = mlc.create_experiment("prompts-from")
    run_id = mlc.create_run(experiment).info.run_id
    name = tracker.prompt_name("prompts-from", "awe")
    first = tracker.register_prompt(
        mlc, name, {"fact_extraction": "a", "memory_update": "b"}, cycle=0, run_id=run_id, score=0.1
    )
    second = tracker.register_prompt(mlc, name, AWE_PROMPTS, cycle=1, run_id=run_id, score=0.2)
    tracker.set_best(mlc, name, second)
    best = load_policy(
        policy_yaml(tmp_path, f"type: awe\nprompts_from: 'prompts:/{name}@best'\n"), uri
    )
    assert best.prompts == AWE_PROMPTS
    numbered = f"type: awe\nprompts_from: 'prompts:/{name}/{first}'\n"
    assert load_policy(policy_yaml(tmp_path, numbered), uri).prompts == {
        "fact_extraction": "a",
        "memory_update": "b",
    }
    with pytest.raises(UserError, match="not in the prompt registry"):
        load_policy(
            policy_yaml(tmp_path, f"type: awe\nprompts_from: 'prompts:/{name}@nope'\n"), uri
        )


def test_a_template_that_does_not_split_back_exactly_is_refused():
    template = tracker.render_prompts({"a": "x\n\n## b\ny", "b": "z"})
    with pytest.raises(UserError, match="ambiguous"):
        tracker.split_prompts(template, ["a", "b"], "w")
    assert tracker.split_prompts("## a\nx\n\n## b\nz", ["a", "b"], "w") == {"a": "x", "b": "z"}
