"""Issue 28: the `gepa` search stopped mid-way and resumed yields the uninterrupted run's cycles.

A run is stopped by Ctrl-C during a GEPA iteration (in process: the reflection request raises
`Interrupted` with the stop flag set, as under the command line's SIGINT handler) or killed
(SIGKILL of a subprocess: after gepa's first call, which evaluates the seed, after its last
reflection, with earlier cycles evaluated, or after an iteration was recorded but before gepa
saved its state), then rerun on the same run folder, MLflow store and
response cache. Every number of the resumed run is compared with an uninterrupted reference
run's: cycles, selected cycle, prompts per cycle, registered prompt versions, logged metrics,
tokens, the questions left out of the reflection feedback, and gepa's own trace of the search
(each iteration's parent, minibatch and scores).

The fake model and the policy make the search non-trivial: a reflection rewrites the prompt to
the next generation ("(gen N)"), and the scripted policy answers better from generation 1 on, so
the first iteration's candidate passes the replay screen and beats the seed on the validation
user (the reference run selects cycle 1, not 0). With `seed: 1` a search resumed in iteration 2
draws a different minibatch for iteration 3 unless gepa's random draws are resumed too.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from memloop.core import interrupt
from memloop.llm.client import ChatClient
from memloop.optimize.config import EvolveConfig, load_config
from memloop.policies.base import Answer
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, is_evolver_request
from memloop.testing.policies import ScriptedPolicy

TESTS = Path(__file__).resolve().parent
REFLECTIONS = 3  # the reference search's iterations, one reflection each


def generation(text: str) -> int:
    found = re.search(r"\(gen (\d+)\)", text)
    return int(found.group(1)) if found else 0


def reply(body: dict[str, Any]) -> str:
    """evolve_loop_reply, except that GEPA's reflection writes the next prompt generation."""
    text = " ".join(str(m.get("content", "")) for m in body["messages"])
    if is_evolver_request(body) and "``` blocks" in text:
        return (
            "```\nRecord every stated fact about the user and update stale ones "
            f"(gen {generation(text) + 1}).\n```"
        )
    return evolve_loop_reply(body)


class ImprovingPolicy(ScriptedPolicy):
    """A scripted policy that answers better under a rewritten prompt (generation >= 1).

    It then picks option 2 instead of 1, and each state variable's second value, not its first.
    """

    def __init__(self, prompts: dict[str, str] | None = None, **options: Any) -> None:
        super().__init__(prompts, garble_every=3, **options)
        self.improved = generation(self._prompts["writer"]) > 0
        if self.improved:
            self.choice = 2

    def answer(
        self, prompt: str, *, schema: dict[str, Any] | None = None, memory_only: bool = False
    ) -> Answer:
        props = (schema or {}).get("properties", {})
        if self.improved and schema is not None and "answer" not in props:
            value = {
                key: (spec["enum"][min(1, len(spec["enum"]) - 1)] if "enum" in spec else "unknown")
                for key, spec in props.items()
            }
            return Answer(json.dumps(value), list(self.seen[-3:]), value)
        return super().answer(prompt, schema=schema, memory_only=memory_only)

    def with_prompts(
        self, prompts: dict[str, str], *, keep_memory: bool = False
    ) -> ImprovingPolicy:
        base = super().with_prompts(prompts, keep_memory=keep_memory)
        twin = ImprovingPolicy(base.prompts(), delay_s=self.delay_s)
        twin.seen = base.seen
        return twin


def builder(
    config: Any, client: Any, workdir: Any, prompts: dict[str, str] | None = None
) -> ImprovingPolicy:
    return ImprovingPolicy(prompts)


def write_config(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "awi.yaml"
    policy.write_text("type: awi\n")
    data = {
        "experiment": "gepa_faults",
        "environment": {
            "procedural": {"users": 5, "periods": 2, "questions": 2, "seed": 1},
            "train_users": 2,
            "val_users": 1,
            "test_users": 2,
        },
        "policy": str(policy),
        "feedback_modes": ["complete"],
        "search": "gepa",
        "seed": 1,  # gepa's sampling: a resumed search must continue its random draws
        "cycles": 2,
        "gepa": {"minibatch_size": 1, "max_metric_calls": 8},
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
    }
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(root: Path, fake: FakeOpenAIServer):
    from memloop.optimize.evolve import run_evolve

    config = load_config(write_config(root), EvolveConfig)
    roles = fake_roles(fake.base_url, root / "c.sqlite")
    (outcome,) = run_evolve(config, progress=False, clients=roles, builder=builder)
    return config, outcome


def observed(config: EvolveConfig, outcome) -> dict[str, Any]:
    """Everything a run chose and counted (not its timings)."""
    from memloop.runs import tracker

    mlc = tracker.client(config.tracking_uri)
    logged = mlc.get_run(outcome.run_id)
    name = logged.data.tags["memloop.prompt_name"]
    metrics = {
        key: [(m.step, m.value) for m in mlc.get_metric_history(outcome.run_id, key)]
        for key in sorted(logged.data.metrics)
        if "seconds" not in key
    }
    run_dir = outcome.run_dir
    return {
        "cycles": [c.cycle for c in outcome.cycles],
        "selected": outcome.selection.cycle,
        "candidate": outcome.selection.candidate,
        "verdict": outcome.selection.verdict,
        "prompts": [
            json.loads((run_dir / f"cycle_{c.cycle:02d}" / "prompts.json").read_text())
            for c in outcome.cycles
        ],
        "prompt_versions": sorted(int(v.version) for v in mlc.search_prompt_versions(name)),
        "best_version": int(mlc.get_prompt_version_by_alias(name, "best").version),
        "tokens": [c.tokens for c in outcome.cycles],
        "omitted": [c.extra["feedback_omitted_questions"] for c in outcome.cycles],
        "gepa_val_score": [c.extra["gepa_val_score"] for c in outcome.cycles],
        "splits": [{s: r.model_dump() for s, r in c.splits.items()} for c in outcome.cycles],
        "metrics": metrics,
        # the search's path: parent, minibatch and scores of every iteration
        "gepa_trace": json.loads((run_dir / "gepa_state" / "run_log.json").read_text()),
    }


def assert_same(resumed: dict[str, Any], reference: dict[str, Any]) -> None:
    # the headline numbers first, for a readable failure
    assert len(resumed["cycles"]) == len(reference["cycles"])
    assert resumed["selected"] == reference["selected"]
    assert resumed["candidate"] == reference["candidate"]
    assert resumed["verdict"] == reference["verdict"]
    assert resumed["prompt_versions"] == reference["prompt_versions"]
    assert [t.get("optimizer") for t in resumed["tokens"]] == [
        t.get("optimizer") for t in reference["tokens"]
    ]
    assert resumed["omitted"] == reference["omitted"]
    for key in reference:
        assert resumed[key] == reference[key], key


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Any]:
    """The uninterrupted run."""
    root = tmp_path_factory.mktemp("reference")
    with FakeOpenAIServer(reply=reply) as fake:
        config, outcome = run(root, fake)
    seen = observed(config, outcome)
    # a search worth resuming: a candidate that wins, feedback cut by the budget, reflections
    # (too few validation users for the gate: the seed stays what the run stands for)
    assert seen["candidate"] == 1 and seen["verdict"] == "too few users"
    assert seen["selected"] == 0 and len(seen["cycles"]) == 1 + REFLECTIONS
    assert seen["prompts"][1]["writer"].endswith("(gen 1).")
    # each cycle counts its own iteration's reflection (the seed's cycle: none)
    assert seen["tokens"][0]["optimizer"] == 0
    assert all(t["optimizer"] > 0 for t in seen["tokens"][1:])
    assert seen["omitted"][-1] > 0
    return seen


# ---------------------------------------------------------------- Ctrl-C during an iteration


@pytest.mark.parametrize(
    "reflection, answered",
    [
        (1, False),  # iteration 1: its reflection request in flight (never answered)
        (2, True),  # iteration 2: its reflection answered (and cached), then Ctrl-C
    ],
    ids=["iteration_1_reflection_in_flight", "iteration_2_reflection_answered"],
)
def test_ctrl_c_during_a_gepa_iteration_then_resume_gives_the_uninterrupted_cycles(
    tmp_path, monkeypatch, reference, reflection, answered
):
    real_chat = ChatClient.chat
    reflections: list[int] = []

    def chat(self, messages, *, component, **kwargs):
        if component == "optimizer":
            reflections.append(1)
            if len(reflections) == reflection:
                if answered:
                    real_chat(self, messages, component=component, **kwargs)
                    interrupt.interrupt()  # what the command line's SIGINT handler does
                    raise interrupt.Interrupted("interrupted")
                interrupt.interrupt()  # the client then gives up on the request
        return real_chat(self, messages, component=component, **kwargs)

    with FakeOpenAIServer(reply=reply) as fake:
        with monkeypatch.context() as patch:
            patch.setattr(ChatClient, "chat", chat)
            try:
                with pytest.raises(KeyboardInterrupt):
                    run(tmp_path, fake)
            finally:
                interrupt.clear()
        assert len(reflections) == reflection
        (history_path,) = tmp_path.glob("runs/*/gepa_cycles.json")
        history = json.loads(history_path.read_text())
        # finished iterations only: the interrupted one is not in the history
        assert [h["iteration"] for h in history if h["iteration"] > 0] == list(range(1, reflection))
        config, outcome = run(tmp_path, fake)
    assert outcome.resumed
    assert_same(observed(config, outcome), reference)


# ---------------------------------------------------------------- killed (SIGKILL)

KILL_SCRIPT = """
import os
import signal
import sys

sys.path.insert(0, {tests!r})
import gepa
from gepa.core.state import GEPAState

from memloop.llm.client import ChatClient
from memloop.optimize.config import EvolveConfig, load_config
from memloop.optimize.evolve import run_evolve
from memloop.testing import fake_roles
from test_faults_gepa import builder


def die():
    os.kill(os.getpid(), signal.SIGKILL)


kill_at = {kill_at!r}
if kill_at == "seed_evaluated":  # gepa's first call returned: the seed evaluated, no cycle
    real_optimize = gepa.optimize

    def optimize(*args, **kwargs):
        real_optimize(*args, **kwargs)
        die()

    gepa.optimize = optimize
elif kill_at == "last_reflection":  # the last reflection answered (and cached), no more
    real_chat = ChatClient.chat
    reflections = []

    def chat(self, messages, *, component, **kwargs):
        result = real_chat(self, messages, component=component, **kwargs)
        if component == "optimizer":
            reflections.append(1)
            if len(reflections) == {reflections}:
                die()
        return result

    ChatClient.chat = chat
else:  # iteration 2 finished and recorded; gepa's state not saved after it
    real_save = GEPAState.save

    def save(self, *args, **kwargs):
        if self.i == 1:  # the first save after iteration 2 (its gepa call ends with one)
            die()
        real_save(self, *args, **kwargs)

    GEPAState.save = save
config = load_config({config!r}, EvolveConfig)
run_evolve(config, progress=False, clients=fake_roles({url!r}, {cache!r}), builder=builder)
"""


# the cycles evaluated before the kill (GEPA yields each as its iteration finishes)
EVALUATED = {"seed_evaluated": [], "last_reflection": [0, 1, 2], "iteration_2_unsaved": [0, 1]}


@pytest.mark.parametrize("kill_at", list(EVALUATED))
def test_killed_gepa_resumes_with_the_uninterrupted_tokens_and_omitted_counts(
    tmp_path, reference, kill_at
):
    path = write_config(tmp_path)
    with FakeOpenAIServer(reply=reply) as fake:
        script = KILL_SCRIPT.format(
            tests=str(TESTS),
            kill_at=kill_at,
            reflections=REFLECTIONS,
            config=str(path),
            url=fake.base_url,
            cache=str(tmp_path / "c.sqlite"),
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], stdout=subprocess.DEVNULL, timeout=120, check=False
        )
        assert proc.returncode == -signal.SIGKILL
        evaluated = sorted(tmp_path.glob("runs/*/cycle_*/cycle.json"))
        assert [int(p.parent.name.split("_")[1]) for p in evaluated] == EVALUATED[kill_at]
        if kill_at == "iteration_2_unsaved":  # gepa will run iteration 2 again
            (history,) = tmp_path.glob("runs/*/gepa_cycles.json")
            assert [h["iteration"] for h in json.loads(history.read_text())][-1] == 2
        sent = sum(1 for body in fake.requests if is_evolver_request(body))
        config, outcome = run(tmp_path, fake)
        resent = sum(1 for body in fake.requests if is_evolver_request(body)) - sent
    assert outcome.resumed
    assert_same(observed(config, outcome), reference)
    if kill_at == "last_reflection":
        # every reflection was answered before the kill: the resumed run replays them from the
        # response cache (its counts above include them) and asks none again
        assert sent > 0 and resent == 0
    if kill_at == "seed_evaluated":  # no reflection before the kill
        assert sent == 0 and resent > 0
