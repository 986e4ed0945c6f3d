"""check_policy: every shipped policy and every test double passes it (against a scripted LLM),
and it catches policies that break the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

import memloop
from memloop.environment.policy import AnswerLike, Policy
from memloop.environment.policy_check import POLICY_MEMBERS, PolicyCheckError, check_policy
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.policies import AWIConfig, NativeConfig, build_policy, load_policy_config
from memloop.policies.awi import AWIPolicy
from memloop.policies.native import NativePolicy
from memloop.testing import FakeOpenAIServer, ScriptedMemoryLLM, ScriptedPolicy

SHIPPED = Path(memloop.__file__).parent / "experiments" / "policies"


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
    def answer(self, prompt, *, schema=None, memory_only=False):
        self.facts["probe"] = {"value": prompt, "step": 0, "time": None}
        return super().answer(prompt, schema=schema, memory_only=memory_only)


class SelfEvolving(NativePolicy):
    def with_prompts(self, prompts, *, keep_memory=False):
        return self


class KeepMemoryIgnored(NativePolicy):
    def with_prompts(self, prompts, *, keep_memory=False):
        return super().with_prompts(prompts)  # drops the memory it was asked to keep


class AcceptsAnyPrompt(ScriptedPolicy):
    def with_prompts(self, prompts, *, keep_memory=False):
        twin = AcceptsAnyPrompt({**self._prompts, **prompts})
        twin.seen = list(self.seen) if keep_memory else []
        return twin


class ClosesOnce(ScriptedPolicy):
    def close(self):
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


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
        (
            KeepMemoryIgnored,
            NativeConfig(),
            "the policy from with_prompts(keep_memory=True) does not hold the original's memory",
        ),
    ],
)
def test_check_policy_catches_broken_policies(fake, tmp_path, cls, config, problem):
    client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=None)
    with pytest.raises(PolicyCheckError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        check_policy(lambda: cls(config, client, tmp_path))
    report = check_policy(lambda: cls(config, client, tmp_path), raise_on_problem=False)
    assert not report.ok and problem in report.problems


@pytest.mark.parametrize(
    "cls, problem",
    [
        (AcceptsAnyPrompt, "with_prompts({'no_such_prompt_name': ...}) was accepted"),
        (ClosesOnce, "a second close() raised RuntimeError('already closed')"),
    ],
)
def test_check_policy_catches_broken_doubles(cls, problem):
    report = check_policy(cls, raise_on_problem=False)
    assert [p for p in report.problems if p.startswith(problem)], report.problems
    assert len(report.problems) == 1  # nothing else is wrong with these doubles


def test_scripted_policy_passes_and_members_come_from_the_protocol():
    report = check_policy(ScriptedPolicy)
    assert report.ok and len(report.checks) > 20
    assert POLICY_MEMBERS == (
        "name",
        "respond",
        "ingest",
        "answer",
        "memory_view",
        "unwritten_messages",
        "prompts",
        "with_prompts",
        "save",
        "load",
        "close",
    )


def test_a_policy_missing_a_member_is_named():
    class NoIngest:
        name = "no-ingest"

        def __getattr__(self, attr):
            if attr == "ingest":
                raise AttributeError(attr)
            return getattr(ScriptedPolicy(), attr)

    report = check_policy(NoIngest, raise_on_problem=False)
    assert report.problems == ["missing members: ingest"]
