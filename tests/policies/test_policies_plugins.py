"""Plug-in policies: `type: package.module:Class`, `type: file.py:Class` and entry-point names go
through the one registry, pass `memloop policy check` and run through `memloop eval`; a `type:`
that does not import, or a class that cannot be a policy, is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.policies import PluginConfig, build_policy, load_policy_config
from memloop.testing import FakeOpenAIServer, ScriptedMemoryLLM
from memloop.testing.commands import eval_argv
from memloop.testing.paths import REPO

EXAMPLE = REPO / "examples" / "keyword_memory"


@pytest.fixture(scope="module")
def fake():
    script = ScriptedMemoryLLM(probe=lambda text, body: _probe(body))
    with FakeOpenAIServer(reply=script) as server:
        yield server


def _probe(body):
    from memloop.testing import request_schema

    props = request_schema(body)["properties"]
    if "answer" in props:
        return {"answer": 1}
    return {k: (p["enum"][0] if "enum" in p else "Oslo") for k, p in props.items()}


@pytest.fixture
def endpoint(tmp_path, fake):
    path = tmp_path / "fake.yaml"
    path.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
    return path


def cli(*args: str) -> int:
    return main(list(args))


def check(policy: Path, endpoint: Path, tmp_path: Path) -> int:
    return cli(
        "policy", "check", str(policy), "--endpoint", str(endpoint), "--cache", str(tmp_path / "c")
    )


def evaluate(policy: Path, endpoint: Path, tmp_path: Path, out: Path) -> int:
    env = tmp_path / "env.json"
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=5), env)
    return main(eval_argv(env, policy, endpoint, tmp_path / "c", out))


# a plug-in written outside the package: a module in its own folder
OUTSIDE = """
import json
from pathlib import Path

from memloop.policies import Answer
from memloop.testing.paths import REPO


class Diary:
    name = "diary"

    def __init__(self, options, client, workdir):
        self.options, self.client, self.workdir = options, client, Path(workdir)
        self.name = options.get("label", "diary")  # an instance may label itself
        self.lines = []
        self.rules = {"diary": "Write everything down."}

    def respond(self, user_message):
        self.lines.append(user_message)
        return "I wrote that down."

    def ingest(self, user_message, assistant_message):
        self.lines.append(user_message)

    def answer(self, prompt, *, schema=None, memory_only=False):
        messages = [{"role": "system", "content": "\\n".join(self.lines)},
                    {"role": "user", "content": prompt}]
        if schema is None:
            return Answer(self.client.chat(messages, component="probe").text, list(self.lines))
        r = self.client.chat_json(messages, schema, component="probe")
        return Answer(r.text, list(self.lines), r.parsed, r.json_error)

    def memory_view(self):
        return "\\n".join(self.lines)

    def unwritten_messages(self):
        return 0

    def prompts(self):
        return dict(self.rules)

    def with_prompts(self, prompts, *, keep_memory=False):
        unknown = set(prompts) - {"diary"}
        if unknown:
            raise KeyError(f"unknown prompts {sorted(unknown)}")
        twin = Diary(self.options, self.client, self.workdir)
        twin.lines = list(self.lines) if keep_memory else []
        twin.rules = {**self.rules, **prompts}
        return twin

    def save(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "diary.txt").write_text("\\n".join(self.lines))
        (Path(directory) / "rules.json").write_text(json.dumps(self.rules))

    def load(self, directory):
        self.rules = json.loads((Path(directory) / "rules.json").read_text())
        text = (Path(directory) / "diary.txt").read_text()
        self.lines = text.split("\\n") if text else []
        return self

    def close(self):
        pass
"""


@pytest.fixture
def outside_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "mydiary"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def test_the_example_passes_policy_check_and_runs_through_eval(tmp_path, endpoint, capsys):
    assert check(EXAMPLE / "policy.yaml", endpoint, tmp_path) == 0
    out = capsys.readouterr().out
    assert "keyword-memory: meets the Policy contract" in out
    assert "FAIL" not in out and out.count("  ok  ") > 20
    # grouped: each check's lines under its heading, the headings in the suite's order
    from memloop.environment.policy_check import SECTIONS

    lines = out.splitlines()[1:-1]  # between the policy's line and the verdict
    headings = [line.removesuffix(":") for line in lines if not line.startswith("  ok  ")]
    assert headings == list(SECTIONS.values())
    assert all(line.startswith("  ok  ") for line in lines[1:] if line[:-1] not in headings)
    assert evaluate(EXAMPLE / "policy.yaml", endpoint, tmp_path, tmp_path / "run") == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["users"] == 2 and metrics["questions"] > 0
    spec = json.loads((tmp_path / "run" / "spec.json").read_text())["spec"]
    # the plug-in's file hash and options are part of what the run records
    assert spec["policy"]["options"] == {"top_k": 3, "max_tokens": 48}
    assert spec["policy"]["source_sha256"] == _sha256(EXAMPLE / "keyword_memory.py")


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_module_plugin_written_outside_the_package(tmp_path, endpoint, outside_package, capsys):
    policy = tmp_path / "diary.yaml"
    policy.write_text("type: mydiary.policy:Diary\nlabel: my-diary\n")
    config = load_policy_config(policy)
    assert isinstance(config, PluginConfig)
    assert (config.target, config.options, config.display_name) == (
        "mydiary.policy:Diary",
        {"label": "my-diary"},
        "diary",
    )
    assert check(policy, endpoint, tmp_path) == 0
    assert "diary: meets the Policy contract" in capsys.readouterr().out
    assert evaluate(policy, endpoint, tmp_path, tmp_path / "run") == 0
    records = (tmp_path / "run" / "records.jsonl").read_text().splitlines()
    assert len({json.loads(r)["user_id"] for r in records}) == 2
    spec = json.loads((tmp_path / "run" / "spec.json").read_text())["spec"]
    assert spec["policy"]["target"] == "mydiary.policy:Diary"


def test_an_installed_package_registers_a_short_name(tmp_path, endpoint, outside_package):
    # what `pip install` of a package declaring [project.entry-points."memloop.policies"] leaves
    dist = outside_package / "mydiary-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mydiary\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[memloop.policies]\ndiary = mydiary.policy:Diary\n")
    policy = tmp_path / "short.yaml"
    policy.write_text("type: diary\n")
    config = load_policy_config(policy)
    assert isinstance(config, PluginConfig) and config.target == "mydiary.policy:Diary"
    assert check(policy, endpoint, tmp_path) == 0


def test_built_in_types_go_through_the_same_registry():
    from memloop.policies import registry

    for name, target in registry.BUILTIN.items():
        cls = registry.load_class(registry.resolve(name, "test"), "test")
        assert f"{cls.__module__}:{cls.__name__}" == target
    assert registry.known_names()[:4] == ["native", "awi", "awe", "rag"]


BROKEN_ANSWER_WRITES = OUTSIDE.replace(
    "    def answer(self, prompt, *, schema=None, memory_only=False):\n",
    "    def answer(self, prompt, *, schema=None, memory_only=False):\n"
    "        self.lines.append(prompt)\n",
)


def test_policy_check_names_a_broken_promise_in_one_line(tmp_path, endpoint, capsys):
    (tmp_path / "leaky.py").write_text(BROKEN_ANSWER_WRITES)
    policy = tmp_path / "leaky.yaml"
    policy.write_text("type: leaky.py:Diary\n")
    assert check(policy, endpoint, tmp_path) == 2
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fails and all("\n" not in f for f in fails)
    assert any("memory" in f for f in fails)  # a probe changed what the policy remembers
    assert "broken promise(s) of the Policy contract" in out


@pytest.mark.parametrize(
    ("yaml_text", "files", "needle"),
    [
        ("type: nosuch_pkg_xyz.mod:Thing\n", {}, "does not import: ModuleNotFoundError"),
        ("type: plug.py:Missing\n", {"plug.py": "X = 1\n"}, "plug.py has no class Missing"),
        ("type: plug.py:X\n", {"plug.py": "X = 1\n"}, "is a int, not a class"),
        ("type: gone.py:Thing\n", {}, "no such file"),
        (
            "type: plug.py:Thing\n",
            {"plug.py": "raise RuntimeError('boom')\n"},
            "RuntimeError: boom",
        ),
        ("type: keywordz\n", {}, "unknown policy type 'keywordz' (registered: native, awi"),
        ("type: 'a.b:'\n", {}, "is not 'package.module:ClassName'"),
        (
            "type: plug.py:Half\n",
            {"plug.py": "class Half:\n    name = 'half'\n    def respond(self, m): return m\n"},
            "Half does not meet the Policy contract: it has no ingest, answer",
        ),
        (
            # the contract before scorer version 3: no written-memory-only state query
            "type: plug.py:Diary\n",
            {"plug.py": OUTSIDE.replace("schema=None, memory_only=False", "schema=None")},
            "Diary does not meet the Policy contract: it has no answer(memory_only=...)",
        ),
    ],
)
def test_bad_plugins_are_one_line_exit_2_and_write_nothing(
    tmp_path, endpoint, capsys, yaml_text, files, needle
):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    policy = tmp_path / "bad.yaml"
    policy.write_text(yaml_text)
    out = tmp_path / "run"
    assert evaluate(policy, endpoint, tmp_path, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()
    assert check(policy, endpoint, tmp_path) == 2
    assert needle in capsys.readouterr().err


def test_a_plugin_constructor_error_is_one_line(tmp_path, endpoint):
    from memloop.core.errors import UserError
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint

    (tmp_path / "plug.py").write_text(
        OUTSIDE.replace("self.name = options", "self.name = options['required_key'] or options")
    )
    policy = tmp_path / "p.yaml"
    policy.write_text("type: plug.py:Diary\n")
    config = load_policy_config(policy)
    client = ChatClient(Endpoint(model="m", base_url="http://127.0.0.1:9/v1"), cache=None)
    with pytest.raises(UserError, match=r"Diary\(options, client, workdir\) failed: KeyError"):
        build_policy(config, client, tmp_path / "w")


def test_plugin_yaml_paths_are_relative_to_the_yaml_folder(tmp_path, monkeypatch):
    sub = tmp_path / "conf"
    sub.mkdir()
    (sub / "plug.py").write_text(OUTSIDE)
    (sub / "p.yaml").write_text("type: plug.py:Diary\n")
    monkeypatch.chdir(tmp_path)  # not the YAML's folder
    config = load_policy_config(sub / "p.yaml")
    assert config.target == f"{(sub / 'plug.py').resolve()}:Diary"
    assert textwrap.dedent(config.type) == "plug.py:Diary"


def test_a_plugin_evolves_like_a_built_in(tmp_path, fake, outside_package):
    import yaml

    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.testing import fake_roles

    (tmp_path / "diary.yaml").write_text("type: mydiary.policy:Diary\n")
    experiment = {
        "experiment": "plugin",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 1, "seed": 2},
            "train_users": 1,
            "val_users": 1,
            "test_users": 1,
        },
        "policy": "diary.yaml",
        "cycles": 2,
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "out_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))
    config = load_config(tmp_path / "exp.yaml", EvolveConfig)
    roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
    (outcome,) = run_evolve(config, progress=False, clients=roles)
    assert [c.cycle for c in outcome.cycles] == [0, 1]
    assert outcome.run_dir.name.startswith("diary-complete-reflective-")
    first = json.loads((outcome.run_dir / "cycle_00" / "prompts.json").read_text())
    assert first == {"diary": "Write everything down."}  # the plug-in's own prompts() evolve
    assert outcome.cycles[1].splits["test"].users == 1
