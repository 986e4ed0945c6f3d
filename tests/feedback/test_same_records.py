"""Issue 32: speeding memloop up changes no result and no cache key.

A fixed eval (AWI, a procedural environment of 2 users x 2 periods x 2 questions, the fake
endpoint's deterministic replies, one response cache) is compared with the records and the sorted
cache keys written by the code before the performance work (tests/data/golden_eval, made at
42a5090 by `python tests/feedback/test_same_records.py --write`).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from memloop.testing.paths import TEST_DATA

GOLDEN = TEST_DATA / "golden_eval"


def fixed_run(out: Path) -> tuple[list[dict], list[str]]:
    from memloop.environment.procedural import generate_procedural
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.llm.roles import RoleClients
    from memloop.policies import build_policy
    from memloop.policies.config import AWIConfig
    from memloop.testing import FakeOpenAIServer
    from memloop.testing.evolvers import evolve_loop_reply

    items = generate_procedural(users=2, periods=2, questions=2, seed=3)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        client = ChatClient(Endpoint(model="fake", base_url=fake.base_url), cache=out / "c.db")
        # the cache key holds base_url: the fake's random port is replaced by a fixed one
        client.endpoint = client.endpoint.model_copy(update={"base_url": "http://fixed/v1"})
        client._resolved_base_url = fake.base_url
        run_evaluation(
            items,
            lambda uid, wd, c: build_policy(AWIConfig(), c, wd),
            out / "run",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(
                sim_config=SimulatorConfig(rounds_init=1, rounds_update=1),
                max_users_in_parallel=1,
                progress=False,
            ),
        )
    records = [
        json.loads(line) for line in (out / "run" / "records.jsonl").read_text().splitlines()
    ]
    with sqlite3.connect(out / "c.db") as conn:
        keys = sorted(row[0] for row in conn.execute("SELECT key FROM responses"))
    return records, keys


def test_a_fixed_run_gives_the_records_and_cache_keys_it_gave_before(tmp_path):
    records, keys = fixed_run(tmp_path)
    assert len(records) == 2 * 3 * 2 and len(keys) > len(records)  # the run did run
    assert keys == json.loads((GOLDEN / "cache_keys.json").read_text())
    golden = [json.loads(line) for line in (GOLDEN / "records.jsonl").read_text().splitlines()]
    assert records == golden


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found, cache_keys = fixed_run(Path(folder))
    GOLDEN.mkdir(parents=True, exist_ok=True)
    (GOLDEN / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    (GOLDEN / "cache_keys.json").write_text(json.dumps(cache_keys, indent=0) + "\n")
    print(f"wrote {len(found)} records and {len(cache_keys)} keys to {GOLDEN}")
