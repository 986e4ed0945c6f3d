"""check_policy: every shipped policy passes it (against a scripted LLM), and it catches policies
that break the contract."""

from __future__ import annotations

import pytest
from fake_llm import ScriptedMemoryLLM
from test_policies_config import SHIPPED

from memloop.environment.policy import AnswerLike, Policy
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.fake_server import FakeOpenAIServer
from memloop.policies import AWIConfig, NativeConfig, build_policy, check_policy, load_policy_config
from memloop.policies.awi import AWIPolicy
from memloop.policies.check import PolicyCheckError
from memloop.policies.native import NativePolicy


def writer(text, body):
    return [{"label": "home_city", "value": "Oslo" if "Oslo" in text else "Lisbon"}]


@pytest.fixture(scope="module")
def fake():
    script = ScriptedMemoryLLM(
        writer=writer,
        facts=lambda text, body: ["Lives in Lisbon"],
        actions=lambda text, body: [
            {"id": "new", "text": "Lives in Lisbon", "event": "ADD", "old_memory": ""}
        ],
        probe=lambda text, body: {"city": "Lisbon"},
    )
    with FakeOpenAIServer(reply=script) as server:
        yield server


@pytest.mark.parametrize("name", ["native", "awi", "awe", "rag"])
def test_shipped_policies_pass_check_policy(fake, tmp_path, monkeypatch, name):
    monkeypatch.setenv("MEMLOOP_TEST_KEY", "sk-check-policy-secret")
    client = ChatClient(
        Endpoint(model="m", base_url=fake.base_url, api_key_env="MEMLOOP_TEST_KEY"),
        cache=tmp_path / "c.sqlite",
    )
    config = load_policy_config(SHIPPED / f"{name}.yaml")
    report = check_policy(
        lambda: build_policy(config, client, tmp_path / "work"),
        forbidden_strings=["sk-check-policy-secret", fake.base_url],
        workdir=tmp_path,
    )
    assert report.ok and len(report.checks) > 20
    policy = build_policy(config, client, tmp_path / "work")
    assert isinstance(policy, Policy)  # the environment's structural contract
    assert isinstance(policy.answer("Where do I live?"), AnswerLike)
    policy.close()
    work = tmp_path / "work"
    assert not work.exists() or list(work.iterdir()) == []  # closed policies leave no files


class WritingProbe(AWIPolicy):
    def answer(self, prompt, *, schema=None):
        self.facts["probe"] = {"value": prompt, "step": 0, "time": None}
        return super().answer(prompt, schema=schema)


class SelfEvolving(NativePolicy):
    def with_prompts(self, prompts):
        return self


class ForgetfulCheckpoint(NativePolicy):
    def _restore(self, state):
        super()._restore(state)
        self.kept = self.kept[1:]


@pytest.mark.parametrize(
    "cls, config, problem",
    [
        (WritingProbe, AWIConfig(update_freq=2, short_term_len=0), "a probe changed memory_view()"),
        (SelfEvolving, NativeConfig(), "with_prompts() returned self"),
        (
            ForgetfulCheckpoint,
            NativeConfig(),
            "memory_view() after load differs from the saved policy's",
        ),
    ],
)
def test_check_policy_catches_broken_policies(fake, tmp_path, cls, config, problem):
    client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=None)
    with pytest.raises(PolicyCheckError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        check_policy(lambda: cls(config, client, tmp_path))
    report = check_policy(lambda: cls(config, client, tmp_path), raise_on_problem=False)
    assert not report.ok and problem in report.problems
