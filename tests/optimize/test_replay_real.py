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


def test_the_edits_evolver_names_failures_and_screens_its_edits_on_the_real_model(
    local_client, tmp_path
):
    """The edits evolver on the real path: a weak writer's on-policy episode, its named write
    failures in the feedback, and candidate edits screened by replaying that episode."""
    from memloop.core.files import json_sha256
    from memloop.feedback.probes import ProbeSettings
    from memloop.feedback.report import collect
    from memloop.feedback.summary import episode_summary
    from memloop.feedback.write_failures import episode_pairs, failure_block, failure_counts
    from memloop.optimize.contract import EvolveInput, propose
    from memloop.optimize.evolvers.edits import EditsEvolver
    from memloop.optimize.replay_score import replay_screen

    seed = "Write one label, topic, naming what the conversation was about in two words."
    letters = ProbeSettings(state_read="letters")
    items = generate_procedural(users=1, periods=1, questions=1, seed=0, choices_per_state=4)

    def factory(prompts):
        return lambda uid, workdir, client: build_policy(AWI, client, workdir, prompts=prompts)

    common = {"sim_config": SCRIPTED, "periods": 1, "max_users_in_parallel": 1, "progress": False}
    on = run_episodes(
        items,
        factory({"writer": seed}),
        local_client,
        tmp_path / "on",
        probe=StateProber(letters),
        **common,
    )
    pairs = episode_pairs(items, on)
    assert pairs and all(p.true for p in pairs)
    questions, _ = collect(on[0].records)
    summary = episode_summary(
        items, questions, "complete", max_questions=8, max_chars=8000, failures=failure_block(pairs)
    )
    assert summary.data()["state_reads"]["wrong_by_failure"] == failure_counts(pairs)
    seen: list[dict[str, str]] = []

    def screen(prompts):
        seen.append(prompts)
        return replay_screen(
            items,
            factory(prompts),
            local_client,
            tmp_path / "on",
            tmp_path / "screen" / json_sha256(prompts)[:12],
            periods=1,
            parallel_users=1,
            probes=letters,
        )

    step = propose(
        EditsEvolver(None, candidates=2),
        EvolveInput(prompts={"writer": seed}, summary=summary, screen=screen),
    )
    assert len(seen) == 3 and seen[0] == {"writer": seed}  # the current prompt, two edits
    (decision,) = step.decisions
    assert decision["n"] == 1 and decision["verdict"] == "too few users"
    taken = step.prompts["writer"] != seed
    assert len(step.rejected) == (1 if taken else 2)
    assert all(r["stage"] in ("screen", "gate") for r in step.rejected)
    assert step.tokens > 0  # the screening's replays, counted
