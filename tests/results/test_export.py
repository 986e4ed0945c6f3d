"""`memloop export`: an evolve run's selected prompts as text, a DSPy program and a mem0 config,
from a run folder or an MLflow run (name or id); and, on the embedded model, a mem0 `Memory`
built from an exported config that extracts with the exported prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.policies.programs import (
    AWE_FACT_EXTRACTION_INSTRUCTIONS,
    AWE_MEMORY_UPDATE_INSTRUCTIONS,
    AWEProgram,
    AWIProgram,
    program_prompts,
)
from memloop.results.export import mem0_config, write_export
from memloop.runs.store import CycleStore
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import small_evolve
from memloop.testing.exports import made_export


@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    """One AWI condition evolved for three cycles on the fake model (sqlite MLflow store)."""
    from memloop.optimize.evolve import run_evolve

    root = tmp_path_factory.mktemp("export")
    config = small_evolve(root, "unit-export", (2, 2, 2), cycles=3)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, root / "c.sqlite")
        (outcome,) = run_evolve(
            config, progress=False, clients=roles, builder=scripted_builder(garble_every=3)
        )
    return config, outcome


def test_text_from_the_run_folder_is_the_selected_cycles_prompt(evolved, tmp_path, capsys):
    from memloop.experiments.cli import main

    config, outcome = evolved
    out = tmp_path / "prompt.txt"
    assert main(["export", str(outcome.run_dir), "--out", str(out)]) == 0
    k = outcome.selection.cycle
    prompt = CycleStore(outcome.run_dir).saved_prompts(k)["writer"]
    text = out.read_text()
    assert text.endswith(f"=== writer ===\n{prompt.rstrip()}\n")
    val = outcome.cycles[k].score("val", outcome.selection.objective)
    assert f"cycle {k} ({outcome.selection.rule})" in text
    assert f"validation {val:.3f}" in text
    assert f"cycle {k} of {outcome.run_dir}" in capsys.readouterr().out


def test_an_mlflow_run_by_name_or_id_gives_the_folders_export(evolved, tmp_path):
    from memloop.experiments.cli import main
    from memloop.runs import tracker

    config, outcome = evolved
    name = tracker.client(config.tracking_uri).get_run(outcome.run_id).info.run_name
    texts = []
    for run in (name, outcome.run_id, str(outcome.run_dir)):
        out = tmp_path / f"{len(texts)}.txt"
        argv = ["export", run, "--tracking-uri", config.tracking_uri, "--out", str(out)]
        assert main(argv) == 0
        texts.append(out.read_text().split("\n# commit")[1])  # after the run's own name
    assert texts[0] == texts[1] == texts[2]


def test_dspy_export_loads_into_the_policys_program(evolved, tmp_path):
    from memloop.experiments.cli import main

    _, outcome = evolved
    out = tmp_path / "writer.json"
    argv = ["export", str(outcome.run_dir), "--format", "dspy", "--cycle", "2", "--out", str(out)]
    assert main(argv) == 0
    program = AWIProgram()
    program.load(str(out))
    saved = CycleStore(outcome.run_dir).saved_prompts(2)
    assert program_prompts(program) == saved
    source = json.loads(out.with_name("writer.source.json").read_text())
    assert (source["cycle"], source["rule"], source["policy"]) == (2, "--cycle 2", "awi")
    # the file names the class to load it into, and DSPy's own loader reads the whole program
    assert source["module"] == "memloop.policies.programs.AWIProgram"
    import dspy

    loaded = dspy.load(str(tmp_path / "writer_program"), allow_pickle=True)
    assert type(loaded) is AWIProgram and program_prompts(loaded) == saved


KILLED_EXPORT = """
import os, pathlib, signal, sys
from memloop.experiments.cli import main

run, out, point, sig = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
replace = pathlib.Path.replace


def killing(self, target):  # stopped at `point`: the file moved (or renamed) then
    if self.name == point:
        os.kill(os.getpid(), sig)
    return replace(self, target)


pathlib.Path.replace = killing
main(["export", run, "--format", "dspy", "--cycle", "2", "--out", str(out)])
"""


def export_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too) by its path, with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    ("point", "signal_name"),
    [
        (".writer.json.tmp.json", "SIGKILL"),  # while DSPy writes the state
        ("writer.json", "SIGTERM"),  # the program folder moved, the state not yet
        ("writer.source.json", "SIGKILL"),  # the state moved, its source not yet
    ],
)
def test_a_dspy_export_killed_midway_is_replaced_by_its_rerun(
    evolved, tmp_path, point, signal_name
):
    """Issue 57: a half-written DSPy export blocked its own rerun ("a file memloop did not
    write"). A kill at each step of writing over an earlier export; the rerun then writes what
    an export never interrupted writes, and leaves nothing else."""
    import signal
    import subprocess
    import sys

    from memloop.experiments.cli import main

    _, outcome = evolved
    reference, folder = tmp_path / "reference", tmp_path / "killed"
    for where in (reference, folder):
        argv = ["export", str(outcome.run_dir), "--format", "dspy", "--out"]
        assert main([*argv, str(where / "writer.json"), "--cycle", "1"]) == 0  # an earlier one
    assert main([*argv, str(reference / "writer.json"), "--cycle", "2"]) == 0
    script = tmp_path / "export.py"
    script.write_text(KILLED_EXPORT)
    sig = getattr(signal, signal_name)
    done = subprocess.run(
        [sys.executable, str(script), str(outcome.run_dir), str(folder / "writer.json")]
        + [point, str(int(sig))],
        capture_output=True,
    )
    assert done.returncode in (-sig, 128 + sig), done.stderr[-500:]
    assert main([*argv, str(folder / "writer.json"), "--cycle", "2"]) == 0  # the rerun
    files, expected = export_files(folder), export_files(reference)
    assert set(files) == set(expected)  # nothing left over: no staging folder, no temporary
    # the same bytes, but for the pickle of the whole program (pickling is not byte-stable
    # from one process to another): the same program when loaded
    pickle = "writer_program/program.pkl"
    assert {k: v for k, v in files.items() if k != pickle} == {
        k: v for k, v in expected.items() if k != pickle
    }
    import dspy

    loaded = [dspy.load(str(f / "writer_program"), allow_pickle=True) for f in (folder, reference)]
    assert program_prompts(loaded[0]) == program_prompts(loaded[1])


def test_a_dspy_export_named_with_dots_is_written_and_says_nothing_else(evolved, tmp_path, capsys):
    """`--out a.b.json` was a 28-line traceback (DSPy refuses a program folder with a suffix);
    its program folder is now `a_b_program`, and DSPy's pickle warning is not printed."""
    from memloop.experiments.cli import main

    _, outcome = evolved
    out = tmp_path / "a.b.json"
    capsys.readouterr()
    assert main(["export", str(outcome.run_dir), "--format", "dspy", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.strip().splitlines()) == 1
    assert "a_b_program" in captured.out
    import dspy

    loaded = dspy.load(str(tmp_path / "a_b_program"), allow_pickle=True)
    assert type(loaded) is AWIProgram
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--format", "mem0"],
            "policy 'awi' has prompts (writer), not mem0's: a mem0 config comes from an AWE run",
        ),
        (["--cycle", "7"], "--cycle 7: "),
        (["--format", "dspy"], "name a .json file"),
    ],
)
def test_refusals_are_one_line(evolved, tmp_path, capsys, argv, needle):
    from memloop.experiments.cli import main

    _, outcome = evolved
    out = tmp_path / "x.txt"
    assert main(["export", str(outcome.run_dir), *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_an_unknown_run_is_one_line(evolved, tmp_path, capsys):
    from memloop.experiments.cli import main

    config, _ = evolved
    argv = ["export", "no-such-run", "--tracking-uri", config.tracking_uri, "--out", "x.txt"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run folder or evolve run of that name" in err[0], err


EVOLVED_RULE = " Write every fact in the present tense and keep each under twelve words."


def awe_export(
    tmp_path: Path, base_url: str = "http://127.0.0.1:9/v1", policy: dict | None = None
) -> Path:
    exported = made_export(
        "awe",
        run="runs/x/complete-reflective",
        cycle=3,
        rule="best val_memory_score",
        objective="memory_score",
        val_objective=0.5,
        test_objective=0.4,
        commit="abc",
        prompts={
            "fact_extraction": AWE_FACT_EXTRACTION_INSTRUCTIONS + EVOLVED_RULE,
            "memory_update": AWE_MEMORY_UPDATE_INSTRUCTIONS,
        },
        policy_config={"type": "awe", **(policy or {})},
        agent={"model": "m", "base_url": base_url, "temperature": 0.0},
    )
    out = tmp_path / "mem0.json"
    write_export(exported, "mem0", out)
    return out


def test_the_mem0_file_is_a_memory_config_with_both_prompts(tmp_path):
    from mem0.configs.base import MemoryConfig

    data = json.loads(awe_export(tmp_path).read_text())
    config = MemoryConfig(**data)
    assert config.custom_fact_extraction_prompt.endswith(EVOLVED_RULE)
    assert config.custom_update_memory_prompt == AWE_MEMORY_UPDATE_INSTRUCTIONS
    assert data["memloop_source"]["cycle"] == 3 and data["memloop_source"]["commit"] == "abc"
    with pytest.raises(Exception, match="not mem0's"):
        mem0_config(made_export("awi"))  # an AWI prompt is no mem0 prompt
    assert set(program_prompts(AWEProgram())) == {"fact_extraction", "memory_update"}


# mem0 2.x's MemoryConfig fields (mem0ai 2.2.1, mem0/configs/base.py); 2.x is not installed
# here (AWE runs mem0 1.x), so its file is checked against them
MEM0_2X_FIELDS = {
    "vector_store",
    "llm",
    "embedder",
    "history_db_path",
    "reranker",
    "version",
    "custom_instructions",
}


def test_the_mem0_export_also_writes_what_mem0_2x_takes_and_says_what_is_lost(tmp_path):
    """Issue 59: mem0 2.x takes the extraction prompt as custom_instructions only; its file
    keeps the run's embedder, store and LLM, holds no 1.x-only key, and records what is lost."""
    from memloop.results.export import MEM0_2X_LOST, is_export, mem0_2x_path

    out = awe_export(tmp_path, policy={"graph_store": {"provider": "kuzu"}})
    first = json.loads(out.read_text())
    assert "graph_store" in first  # the 1.x config keeps the graph store
    second_path = mem0_2x_path(out)
    assert second_path == tmp_path / "mem0.2x.json"
    second = json.loads(second_path.read_text())
    assert set(second) - {"memloop_source"} <= MEM0_2X_FIELDS
    assert second["custom_instructions"] == first["custom_fact_extraction_prompt"]
    assert second["custom_instructions"].endswith(EVOLVED_RULE)
    for key in ("embedder", "vector_store", "llm", "history_db_path", "version"):
        assert second[key] == first[key], key
    assert second["memloop_source"]["mem0_2x_lost"] == MEM0_2X_LOST
    assert "memory_update" in MEM0_2X_LOST and "graph store" in MEM0_2X_LOST
    assert is_export(second_path) and is_export(out)
    # an edited 2.x file is the user's: a new export refuses to replace it
    second_path.write_text(second_path.read_text().replace("mem0-history.sqlite", "mine.sqlite"))
    with pytest.raises(Exception, match="mem0.2x.json"):
        awe_export(tmp_path)


def test_mem0_builds_the_exported_config_offline_with_the_runs_embedder_and_store(
    tmp_path, monkeypatch
):
    """`Memory.from_config` on the file as written: no network, no key (a loopback LLM)."""
    from mem0 import Memory
    from mem0.vector_stores.qdrant import Qdrant

    from memloop.policies.config import PACKAGED_EMBEDDER
    from memloop.policies.embedder import resolve_embedding_model

    config = json.loads(awe_export(tmp_path).read_text())
    monkeypatch.chdir(tmp_path)  # the store and history files are relative to where mem0 runs
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    memory = Memory.from_config(config)
    assert memory.embedding_model.config.model == str(resolve_embedding_model(PACKAGED_EMBEDDER))
    assert len(memory.embedding_model.embed("I live in Oslo.")) == 384  # MiniLM, offline
    assert isinstance(memory.vector_store, Qdrant) and (tmp_path / "mem0-vector-store").is_dir()
    assert memory.config.llm.config["openai_base_url"] == "http://127.0.0.1:9/v1"
    assert memory.config.custom_fact_extraction_prompt.endswith(EVOLVED_RULE)


CANARY = "sk-canary-57-0123456789abcdef"


@pytest.mark.parametrize(
    ("base_url", "key_env", "api_key"),
    [
        ("http://127.0.0.1:9/v1", None, "not-needed"),  # a loopback server takes none
        ("https://stand-in.example/v1", None, "not-needed"),  # as memloop sent it none
        (
            "https://stand-in.example/v1",
            "STAND_IN_KEY",
            "<replace with the value of $STAND_IN_KEY>",
        ),
        ("https://api.openai.com/v1", None, None),  # mem0's OPENAI_API_KEY: OpenAI's own key
        ("https://api.openai.com/v1", "OTHER_KEY", "<replace with the value of $OTHER_KEY>"),
    ],
)
def test_mem0_is_never_left_to_send_openai_api_key_to_another_host(
    tmp_path, monkeypatch, base_url, key_env, api_key
):
    """Issue 57: with no key in its config mem0 sends $OPENAI_API_KEY to whatever host it names;
    the export names the key (or says none is needed) everywhere but OpenAI's own host."""
    from mem0 import Memory

    exported = made_export(
        "awe",
        prompts={"fact_extraction": "f", "memory_update": "u"},
        policy_config=None,
        base_url=base_url,
    )
    out = tmp_path / "mem0.json"
    write_export(exported, "mem0", out, key_env)
    config = json.loads(out.read_text())
    assert config["llm"]["config"].get("api_key") == api_key
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    memory = Memory.from_config(config)  # mem0's own client: the key it would send
    sent = memory.llm.client.api_key
    assert (sent == CANARY) == (api_key is None)


def test_the_export_command_names_the_key_variable_and_refuses_a_key(tmp_path, capsys):
    from memloop.experiments.cli import main

    assert main(["export", "r", "--out", str(tmp_path / "p.txt"), "--api-key-env", "K"]) == 2
    assert "only --format mem0" in capsys.readouterr().err
    argv = ["export", "r", "--format", "mem0", "--out", str(tmp_path / "m.json")]
    assert main([*argv, "--api-key-env", CANARY]) == 2
    err = capsys.readouterr().err
    assert "NAME of an environment variable" in err and CANARY not in err


@pytest.mark.parametrize(
    ("base_url", "policy", "needle"),
    [
        ("local", None, "the run's agent was memloop's embedded model"),
        (
            "http://127.0.0.1:9/v1",
            {"vector_store": {"provider": "pgvector", "config": {"password_env": "PGPASS"}}},
            "vector_store (pgvector) reads password_env from the environment",
        ),
    ],
)
def test_a_mem0_part_that_cannot_be_exported_is_refused_in_one_line(
    tmp_path, base_url, policy, needle
):
    from memloop.core.errors import UserError

    with pytest.raises(UserError, match="--format mem0: ") as info:
        awe_export(tmp_path, base_url, policy)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "mem0.json").exists()


def test_the_exported_awe_program_runs_both_steps():
    import dspy
    from dspy.utils.dummies import DummyLM

    program = AWEProgram(fact_extraction="Extract the user's facts.")
    lm = DummyLM([{"facts": ["Lives in Oslo"]}, {"memory": '[{"id": "new", "event": "ADD"}]'}])
    with dspy.context(lm=lm):
        out = program(conversation="user: I live in Oslo now.")
    assert out.facts == ["Lives in Oslo"]
    assert json.loads(out.memory) == [{"id": "new", "event": "ADD"}]


@pytest.mark.real_model
def test_an_exported_mem0_config_extracts_with_the_evolved_prompt(local_client, tmp_path):
    """mem0's own Memory, on the embedded model through mem0's OpenAI provider, as
    `export --check` deploys it (`AWEPolicy.deployed`): a turn is stored with the evolved prompt
    and read back into the assistant's context."""
    from memloop.policies import AWEConfig
    from memloop.policies.external import AWEPolicy

    base_url = local_client.resolved_base_url()
    config = json.loads(awe_export(tmp_path, base_url).read_text())
    # the embedded server answers only requests that carry its secret (issue 57, point 3); a
    # served endpoint's key goes here the same way (export --check fills it from --api-key-env)
    key = local_client._server.key
    config["llm"]["config"].update(model="local-0.5b", max_tokens=200, api_key=key)
    policy = AWEPolicy.deployed(AWEConfig(short_term_len=0), local_client, tmp_path / "w", config)
    try:
        assert type(policy.memory.llm).__module__.startswith("mem0.")  # mem0's own client
        sent: list[list[dict]] = []
        generate = policy.memory.llm.generate_response

        def recording(messages, *args, **kwargs):  # the real call, its messages kept
            sent.append(messages)
            return generate(messages, *args, **kwargs)

        policy.memory.llm.generate_response = recording
        policy.ingest("I live in Lisbon and I work as a nurse.", "Noted.")
        assert sent, "mem0 sent no request"
        assert sent[0][0]["role"] == "system"
        assert sent[0][0]["content"] == config["custom_fact_extraction_prompt"]  # evolved
        stored = policy.memory_texts()
        assert stored, "the extraction stored no memory"
        _, shown = policy._context("Where do I live?", probe=True)
        assert set(shown) & set(stored)  # read back through the deployed store and embedder
    finally:
        policy.close()


def test_an_exported_prompt_starts_an_eval_on_new_users(evolved, tmp_path):
    """export -> `prompts_from:` file -> `memloop eval` of the real AWI policy on other users: its
    memory writes are requested with the exported prompt."""
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.experiments.cli import main
    from memloop.testing import schema_valid_reply

    _, outcome = evolved
    k = outcome.selection.cycle
    writer = CycleStore(outcome.run_dir).saved_prompts(k)["writer"]
    from memloop.policies.programs import AWI_WRITER_INSTRUCTIONS

    assert writer.strip() != AWI_WRITER_INSTRUCTIONS.strip()  # an evolved prompt, not AWI's own
    assert main(["export", str(outcome.run_dir), "--out", str(tmp_path / "evolved.txt")]) == 0
    (tmp_path / "policy.yaml").write_text("type: awi\nprompts_from: evolved.txt\n")
    env = tmp_path / "new-users.json"
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=11), env)
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        (tmp_path / "fake.yaml").write_text(f"model: other-model\nbase_url: {fake.base_url}\n")
        argv = ["eval", "--env", str(env), "--endpoint", str(tmp_path / "fake.yaml")]
        argv += ["--policy", str(tmp_path / "policy.yaml"), "--out", str(tmp_path / "run")]
        assert main([*argv, "--cache", str(tmp_path / "c.db")]) == 0
        systems = [r["messages"][0]["content"] for r in fake.requests]
    assert sum(writer.strip() in s for s in systems) >= 2  # one write per user at least
    spec = json.loads((tmp_path / "run" / "spec.json").read_text())
    assert spec["spec"]["policy"]["prompts"] == {"writer": writer.rstrip("\n")}


def test_a_registry_version_seeds_a_new_evolve(evolved, tmp_path):
    """`prompts_from: prompts:/NAME/VERSION` in an evolve's policy: its cycle 0 holds the prompts
    of that version (the first run's cycle 2, evolved from its cycle 0)."""
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker

    config, outcome = evolved
    store = CycleStore(outcome.run_dir)
    assert store.saved_prompts(2) != store.saved_prompts(0)
    mlc = tracker.client(config.tracking_uri, create=False)
    name = mlc.get_run(outcome.run_id).data.tags["memloop.prompt_name"]
    # the version holding cycle 2's text (registered by the first cycle that held it)
    cycle_2 = tracker.render_prompts(store.saved_prompts(2) or {})
    (version,) = [v.version for v in mlc.search_prompt_versions(name) if v.template == cycle_2]
    (tmp_path / "seeded.yaml").write_text(f"type: awi\nprompts_from: 'prompts:/{name}/{version}'\n")
    data = yaml.safe_load(Path(config.source).read_text())
    data.update(
        experiment="unit-export-seeded",
        policy=str(tmp_path / "seeded.yaml"),
        cycles=1,
        evolvers=["none"],
        out_dir=str(tmp_path / "runs"),
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    seeded = load_config(tmp_path / "exp.yaml", EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        (run,) = run_evolve(seeded, progress=False, clients=roles)
    assert CycleStore(run.run_dir).saved_prompts(0) == store.saved_prompts(2)
