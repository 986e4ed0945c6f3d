"""Issue 43: moving optimize/ into rooms changes no evolve run.

A fixed evolve run per search (episode with the reflective, playbook and edits evolvers, period,
GEPA; AWI on a procedural environment of 4 users, the fake endpoint's deterministic replies) is
compared with what the code wrote before the move (tests/data/golden_cycles, made at 7d9aa7f,
the code of 63bed7c, by `python tests/optimize/test_same_cycles.py --write`): every cycle's
records, prompts, steps and summaries, the run's identity, and the metrics and tags it logged to
MLflow. Left out: wall-clock times, the commit, the fake server's random port and absolute paths.

One change on purpose, the issue's own: GEPA yields each cycle as its iteration finishes, so each
cycle counts its own iteration's reflection. gepa.json was written again for it; the only
differences are `tokens/optimizer` (cycle 0: 45 before, 0 now; cycles 1-3: 15 each, 45 in all)
and `tokens/search_episodes` (0, now logged for every cycle). Nothing else moved.

A second change on purpose (issue 56): the edits evolver screens 5 candidates by default (4
before) and names each candidate's sentences in its step. episode-edits.json was written again;
its differences are the candidates line, the screen's fifth score and its Bonferroni level (0.01
for 5), the fifth candidate's refusal and its replay folder. The other cases did not move.

A third (issue 56): the edits evolver's `screen_budget` setting (successive halving). Its 2
training users are too few to halve, so the run is the same; episode-edits.json gains only the
setting in its spec and its MLflow param.

A fourth (issue 57): the optimizer's feedback shows each private value as its typed placeholder
(`[home_type #2]`, core/leaks.Redactor). The feedback summaries of the episode and period runs
were written again; their only differences are the values turned placeholders and the summaries'
`chars`. The fake optimizer's replies do not read the values, so no prompt, step or score moved;
GEPA's stored records hold no summary text and did not move.

A fifth (issue 58): each split of a cycle record gains `more`, the catalogue's metrics without a
field of their own (feedback/metrics.py); it is empty in every case here, and nothing else moved
(the five files were written again).

A sixth (issue 60): each split of a cycle record gains `health` and `alarms` (the users' memory
health, feedback/health.py), and the MLflow metrics gain `<split>/health/...`. The five files were
written again; with those fields and metrics left out, old and new are equal.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from memloop.testing.paths import TEST_DATA

GOLDEN = TEST_DATA / "golden_cycles"
CASES = {
    "episode-reflective": {"evolvers": ["reflective"]},
    "episode-playbook": {"evolvers": ["playbook"]},
    "episode-edits": {"evolvers": ["edits"]},
    "period": {"search": "period"},
    "gepa": {
        "search": "gepa",
        "evolvers": None,
        "gepa": {"minibatch_size": 1, "max_metric_calls": 6},
    },
}
# wall-clock times, the commit, and the run key and its short form, which hash the fake server's
# random port (spec.json, compared scrubbed, holds what the key hashes)
VOLATILE = {"seconds", "started", "finished", "created", "timestamp", "search_seconds"}
VOLATILE |= {"git_revision"}
VOLATILE |= {"key", "spec.key", "memloop.run_key", "memloop.like"}


def scrub(value: Any, root: str) -> Any:
    """`value` without wall-clock times, the run's folder or the fake server's port."""
    if isinstance(value, dict):
        return {k: scrub(v, root) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v, root) for v in value]
    if isinstance(value, str):
        value = value.replace(root, "<root>")
        return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", value)
    return value


def fixed_run(root: Path, case: str) -> dict[str, Any]:
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker
    from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
    from memloop.testing.commands import small_evolve

    config = small_evolve(root, f"same-{case}", (2, 1, 1), cycles=2, **CASES[case])
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, root / "c.sqlite")
        (outcome,) = run_evolve(
            config, progress=False, clients=roles, builder=scripted_builder(garble_every=3)
        )
    files = {}
    for path in sorted(outcome.run_dir.rglob("*.json")):
        rel = path.relative_to(outcome.run_dir).as_posix()
        if rel.startswith("cycle_") or rel in ("gepa_cycles.json", "selection.json", "spec.json"):
            if "/episodes/" not in rel and "/eval/" not in rel:
                files[rel] = json.loads(path.read_text())
    run = tracker.client(config.tracking_uri).get_run(outcome.run_id)
    history = {}
    mlc = tracker.client(config.tracking_uri)
    for name in sorted(run.data.metrics):
        history[name] = [(m.step, m.value) for m in mlc.get_metric_history(outcome.run_id, name)]
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    return scrub(
        {
            "selection": outcome.selection.model_dump(),
            "files": files,
            "metrics": history,
            "params": dict(run.data.params),
            "tags": tags,
        },
        str(root),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fixed_evolve_run_gives_what_it_gave_before(tmp_path, case):
    found = json.loads(json.dumps(fixed_run(tmp_path, case)))
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    assert len(found["files"]) >= 4 and found["metrics"]  # the run did run
    assert found == golden


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in sorted(CASES):
        with tempfile.TemporaryDirectory() as folder:
            found = fixed_run(Path(folder), name)
        (GOLDEN / f"{name}.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {name}: {len(found['files'])} files, {len(found['metrics'])} metrics")
