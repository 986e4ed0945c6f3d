"""Record once, score off-policy, on the embedded model: with scripted sessions (the user's turns
are the environment's) and replies that see only the current message, replaying a record-only
recording to a policy gives exactly the state answers of its on-policy run."""

from __future__ import annotations

import pytest

from memloop.environment.episode import run_episodes
from memloop.environment.procedural import generate_procedural
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.probes import StateProber
from memloop.policies import AWIConfig, build_policy, recorder_config

pytestmark = pytest.mark.real_model

AWI = AWIConfig(update_freq=2, short_term_len=0, reply_memory=False, reply_max_tokens=8)
SCRIPTED = SimulatorConfig(rounds_init=1, rounds_update=1)


def _answers(episodes):
    return [
        (r.period, q["question_index"], q["state_answers"], r.probes["memory_view"])
        for e in episodes
        for r in e.records
        for q in r.probes["questions"]
    ]


def test_replaying_a_recording_equals_the_on_policy_run(local_client, tmp_path):
    items = generate_procedural(users=1, periods=1, questions=1, seed=0, choices_per_state=4)

    def awi(uid, workdir, client):
        return build_policy(AWI, client, workdir)

    def recorder(uid, workdir, client):
        return build_policy(recorder_config(AWI), client, workdir)

    common = {"sim_config": SCRIPTED, "periods": 1, "max_users_in_parallel": 1, "progress": False}
    on = run_episodes(items, awi, local_client, tmp_path / "on", probe=StateProber(), **common)
    recorded = run_episodes(items, recorder, local_client, tmp_path / "rec", **common)
    assert all(r.probes == {} for r in recorded[0].records)  # recorded, never probed
    off = run_episodes(
        items,
        awi,
        local_client,
        tmp_path / "off",
        probe=StateProber(),
        replay_from=tmp_path / "rec",
        **common,
    )
    assert {r.mode for r in off[0].records} == {"off_policy"}
    assert _answers(off) == _answers(on)
    assert any(view for *_, view in _answers(on))  # the writer stored something
