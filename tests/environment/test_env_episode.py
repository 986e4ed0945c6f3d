"""The episode runner and user simulator: on-policy and off-policy episodes, per-period
checkpoints, resume after a kill, and the simulator on the embedded model."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memloop.environment.episode import (
    EpisodeRunner,
    finished_records,
    load_replay,
    period_dir,
    run_episodes,
)
from memloop.environment.procedural import generate_procedural
from memloop.environment.simulator import SimulatorConfig, UserSimulator, hidden_values_named
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing import FakeOpenAIServer, ScriptedPolicy
from memloop.testing.paths import REPO


def fake_client(server: FakeOpenAIServer, tmp_path: Path) -> ChatClient:
    return ChatClient(
        Endpoint(model="sim", base_url=server.base_url), cache=tmp_path / "cache.sqlite"
    )


@pytest.fixture
def item():
    return generate_procedural(users=1, periods=3, questions=2, seed=7)[0]


def test_on_policy_episode_structure(tmp_path, item):
    with FakeOpenAIServer(reply="Could you say more about that?") as fake:
        sim = UserSimulator(
            fake_client(fake, tmp_path), SimulatorConfig(rounds_init=1, rounds_update=2)
        )
        policy = ScriptedPolicy()
        probed = []
        runner = EpisodeRunner(
            item,
            policy,
            tmp_path / "u",
            simulator=sim,
            probe=lambda it, p, pol, rec: probed.append(p) or {"p": p},
        )
        result = runner.run()
    assert [r.period for r in result.records] == [0, 1, 2, 3]
    assert probed == [0, 1, 2, 3]
    first = result.records[0].sessions[0]
    assert first.messages[0]["content"].startswith(f"[Current Time: {first.session_time}]\n")
    assert len(first.messages) == 2  # one round in period 0
    for rec in result.records[1:]:
        for log in rec.sessions:
            assert [m["role"] for m in log.messages] == ["user", "assistant"] * 2
            assert log.messages[2]["content"] == "Could you say more about that?"
    # one simulator call per extra round in periods >= 1, none in period 0
    n_sessions = sum(len(item.periods[p].sessions) for p in range(1, 4))
    assert len(fake.requests) == n_sessions
    assert (period_dir(tmp_path / "u", 3) / "record.json").is_file()
    assert (period_dir(tmp_path / "u", 3) / "policy" / "scripted.json").is_file()


class NumberedReplies(ScriptedPolicy):
    """Every reply unique, so the test can find it in the simulator's requests."""

    def respond(self, user_message: str) -> str:
        super().respond(user_message)
        return f"assistant reply number {self.respond_calls} (zebra-{self.respond_calls * 7919})"


def test_assistant_reply_reaches_the_simulators_next_request(tmp_path, item):
    """The on-policy property: the user's follow-up is generated from what the assistant said."""
    import json

    with FakeOpenAIServer(reply="Go on.") as fake:
        sim = UserSimulator(
            fake_client(fake, tmp_path), SimulatorConfig(rounds_init=1, rounds_update=2)
        )
        policy = NumberedReplies()
        result = EpisodeRunner(item, policy, tmp_path / "u", simulator=sim, periods=3).run()
        requests = [json.dumps(body["messages"]) for body in fake.requests]
    # each 2-round session: the first reply precedes exactly one simulator request, in order
    followed = [log.messages[1]["content"] for rec in result.records[1:] for log in rec.sessions]
    assert len(followed) == len(requests) > 0
    for reply, request in zip(followed, requests, strict=True):
        assert json.dumps(reply)[1:-1] in request
    # and no request sees a reply the assistant had not given yet
    for i, request in enumerate(requests):
        later = [r for r in followed[i + 1 :] if json.dumps(r)[1:-1] in request]
        assert later == []


def test_simulator_prompt_hides_non_exposed_variables(tmp_path, item):
    with FakeOpenAIServer(reply="ok") as fake:
        sim = UserSimulator(fake_client(fake, tmp_path))
        session = item.periods[1].sessions[0]
        sim.follow_up(
            item,
            1,
            session,
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        )
    system = fake.requests[0]["messages"][0]["content"]
    hidden = set(item.state_schema) - set(session.exposed_states)
    assert hidden
    for var in hidden:
        assert var.replace("_", " ") in system.split("must NOT reveal")[1]
    for var in session.exposed_states:
        assert f"- {var.replace('_', ' ')} (" not in system


def test_follow_up_naming_a_hidden_value_is_redrawn(tmp_path, item):
    session = item.periods[1].sessions[0]
    hidden_var = sorted(set(item.state_schema) - set(session.exposed_states))[0]
    leak = item.state_at(1)[hidden_var].replace("_", " ")
    replies = iter([f"By the way, {leak}!", "What else should I consider?"])
    with FakeOpenAIServer(reply=lambda body: next(replies)) as fake:
        sim = UserSimulator(fake_client(fake, tmp_path), SimulatorConfig(leak_retries=2))
        follow = sim.follow_up(item, 1, session, [{"role": "assistant", "content": "x"}])
    if len(leak) >= 5:
        assert follow.text == "What else should I consider?" and not follow.leaked_variables
        assert len(fake.requests) == 2
    assert hidden_values_named(f"so {leak} now", item, 1, session.exposed_states) == (
        [hidden_var] if len(leak) >= 5 else []
    )


def test_off_policy_replay_feeds_recorded_turns(tmp_path, item):
    with FakeOpenAIServer(reply="Tell me more.") as fake:
        run_episodes(
            [item],
            lambda uid, wd, c: ScriptedPolicy(),
            fake_client(fake, tmp_path),
            tmp_path / "onpolicy",
            periods=2,
            progress=False,
        )
    replay = load_replay(tmp_path / "onpolicy", item.id)
    policy = ScriptedPolicy()
    result = EpisodeRunner(item, policy, tmp_path / "off", replay=replay, periods=2).run()
    assert policy.respond_calls == 0
    assert [r.mode for r in result.records] == ["off_policy", "off_policy"]
    recorded_users = [
        m["content"] for p in (0, 1) for s in replay[p] for m in s if m["role"] == "user"
    ]
    assert policy.seen == recorded_users


KILL_SCRIPT = """
import sys, json
sys.path.insert(0, {root!r})
from pathlib import Path
from memloop.testing import ScriptedPolicy
from memloop.environment.episode import run_episodes
from memloop.environment.procedural import generate_procedural
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
item = generate_procedural(users=1, periods=3, questions=2, seed=7)[0]
client = ChatClient(Endpoint(model="sim", base_url={url!r}), cache={cache!r})
run_episodes([item], lambda uid, wd, c: ScriptedPolicy(delay_s=0.4), client, Path({out!r}),
             progress=False)
"""


def test_killed_episode_resumes_from_last_finished_period(tmp_path, item):
    out = tmp_path / "run"
    with FakeOpenAIServer(reply="And then?") as fake:
        script = KILL_SCRIPT.format(
            root=str(REPO),
            url=fake.base_url,
            cache=str(tmp_path / "c.sqlite"),
            out=str(out),
        )
        proc = subprocess.Popen([sys.executable, "-c", script])
        user_dir = out / item.id
        deadline = time.monotonic() + 60
        while not (period_dir(user_dir, 1) / "record.json").exists():
            assert proc.poll() is None, "the episode ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = finished_records(user_dir, 4)
        assert 2 <= len(done) < 4, "kill came too late to test resume"
        mtimes = {
            p: (period_dir(user_dir, p) / "record.json").stat().st_mtime_ns
            for p in range(len(done))
        }
        policies = []

        def factory(uid, wd, c):
            policies.append(ScriptedPolicy())
            return policies[-1]

        result = run_episodes([item], factory, fake_client(fake, tmp_path), out, progress=False)[0]
    assert result.resumed_from == len(done)
    assert [r.period for r in result.records] == [0, 1, 2, 3]
    for p, mtime in mtimes.items():  # finished periods were not redone
        assert (period_dir(user_dir, p) / "record.json").stat().st_mtime_ns == mtime
    # the restored policy state holds every period's user turns, the earlier ones from disk
    expected = [
        m["content"]
        for r in result.records
        for s in r.sessions
        for m in s.messages
        if m["role"] == "user"
    ]
    assert policies[0].seen == expected
    rounds = sum(len(s.messages) // 2 for r in result.records[len(done) :] for s in r.sessions)
    assert policies[0].respond_calls == rounds


@pytest.mark.real_model
def test_simulator_holds_two_round_session_on_embedded_model(local_client, item, tmp_path):
    sim = UserSimulator(local_client, SimulatorConfig(rounds_init=1, rounds_update=2))
    policy = ScriptedPolicy()
    runner = EpisodeRunner(item, policy, tmp_path / "u", simulator=sim, periods=2)
    record = runner.run().records[1]
    log = record.sessions[0]
    assert [m["role"] for m in log.messages] == ["user", "assistant", "user", "assistant"]
    follow = log.messages[2]["content"]
    assert follow.strip() and follow != log.messages[0]["content"]
    assert not follow.lower().startswith(("user:", "you:"))
    assert (
        local_client.usage.component("user_sim").calls
        + local_client.usage.component("user_sim").cached_calls
        >= 1
    )
