"""Issue 30: `price_per_mtok` gives a run's cost in money, priced by the client that made each call.

The fake server answers every request with 10 prompt and 5 completion tokens, so a call on an
endpoint priced (input, output) per million tokens costs (10 input + 5 output) / 1e6 dollars; the
tests count calls and compare with that.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from memloop.core.errors import UserError
from memloop.core.tables import format_cost
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.llm.usage import UsageTracker, add_costs
from memloop.testing import FakeOpenAIServer, evolve_loop_reply
from memloop.testing.commands import small_evolve

PRICES = {  # role -> (input, output) dollars per million tokens
    "agent": (2.0, 8.0),
    "user_sim": (0.5, 1.0),
    "checker": (3.0, 15.0),
    "optimizer": (10.0, 30.0),
}


def per_call(role: str) -> float:
    price_in, price_out = PRICES[role]
    return (10 * price_in + 5 * price_out) / 1e6


def priced_roles(base_url: str, cache: Path) -> RoleClients:
    from memloop.llm.cache import ResponseCache

    shared = ResponseCache(cache)
    return RoleClients(
        *(
            ChatClient(
                Endpoint(
                    model=f"m-{role}",
                    base_url=base_url,
                    price_per_mtok={"input": PRICES[role][0], "output": PRICES[role][1]},
                ),
                cache=shared,
            )
            for role in ("agent", "user_sim", "checker", "optimizer")
        )
    )


def test_a_price_is_dollars_per_million_tokens_and_not_part_of_a_runs_identity():
    priced = Endpoint(model="m", base_url="http://x/v1", price_per_mtok={"input": 2, "output": 10})
    assert priced.cost_usd(1000, 200) == pytest.approx((1000 * 2 + 200 * 10) / 1e6)
    assert Endpoint(model="m", base_url="http://x/v1").cost_usd(1000, 200) is None
    # a price changes no response: the same identity, so changing it resumes a run
    assert priced.result_settings() == Endpoint(model="m", base_url="http://x/v1").result_settings()


@pytest.mark.parametrize(
    ("price", "needle"),
    [
        ({"input": -1, "output": 2}, "price_per_mtok.input"),
        ({"input": 1}, "price_per_mtok.output"),
        ({"input": 1, "output": 2, "cached": 0.5}, "price_per_mtok.cached"),
        (3.0, "price_per_mtok"),
    ],
)
def test_a_bad_price_is_refused_naming_the_key(price, needle):
    with pytest.raises(UserError) as err:
        Endpoint.from_mapping({"model": "m", "price_per_mtok": price}, "ep.yaml")
    assert needle in str(err.value) and "ep.yaml" in str(err.value)


def test_the_tracker_adds_costs_only_where_a_call_had_a_price():
    usage = UsageTracker()
    usage.record("agent", prompt_tokens=100, completion_tokens=10, cached=False, cost_usd=0.25)
    usage.record("agent", prompt_tokens=100, completion_tokens=10, cached=True, cost_usd=0.5)
    usage.record("user_sim", prompt_tokens=7, completion_tokens=3, cached=False)
    mark = usage.mark("agent")
    usage.record("agent", prompt_tokens=1, completion_tokens=1, cached=False, cost_usd=0.125)
    rows = usage.summary()
    assert rows["agent"]["cost_usd"] == 0.875  # a cached answer's tokens are priced too
    assert "cost_usd" not in rows["user_sim"]  # no price: no cost, not a cost of 0
    assert rows["total"]["cost_usd"] == 0.875
    assert (mark.tokens(), mark.cost_usd()) == (2, 0.125)
    assert usage.mark("user_sim").cost_usd() is None
    unpriced = UsageTracker()
    unpriced.record("agent", prompt_tokens=1, completion_tokens=1, cached=False)
    assert all("cost_usd" not in row for row in unpriced.summary().values())
    assert add_costs(None, None) is None and add_costs(None, 0.5, 0.25) == 0.75


@pytest.mark.parametrize(
    ("dollars", "cell"),
    [(None, "n/a"), (0.0, "0.0000"), (0.01234, "0.0123"), (2.5, "2.50"), (1234.5, "1,234.50")],
)
def test_cost_cells(dollars, cell):
    assert format_cost(dollars) == cell
    assert format_cost(0.00003) == "3.0e-05"


def test_each_call_is_priced_by_its_own_endpoint_cached_answers_included(tmp_path):
    with FakeOpenAIServer(reply=lambda body: "hi") as fake:
        roles = priced_roles(fake.base_url, tmp_path / "c.sqlite")
        messages = [{"role": "user", "content": "hello"}]
        roles.agent.chat(messages, component="agent")
        roles.agent.chat(messages, component="agent")  # from the response cache
        roles.optimizer.chat(messages, component="optimizer")
    agent = roles.agent.usage.summary()["agent"]
    assert (agent["calls"], agent["cached_calls"]) == (1, 1)
    assert agent["cost_usd"] == pytest.approx(2 * per_call("agent"))
    opt = roles.optimizer.usage.summary()["optimizer"]["cost_usd"]
    assert opt == pytest.approx(per_call("optimizer"))


def component_role(component: str) -> str:
    """Which role's client makes a component's calls in an evaluation."""
    return {"user_sim": "user_sim", "checker": "checker"}.get(component, "agent")


def expected_cost(rows: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Dollars per component from the period records' call counts and the fake's 10 + 5 tokens."""
    out: dict[str, float] = {}
    for usage in rows:
        for component, row in usage.items():
            assert row["prompt_tokens"] == 10 * (row["calls"] + row["cached_calls"])
            calls = row["calls"] + row["cached_calls"]
            out[component] = out.get(component, 0.0) + calls * per_call(component_role(component))
    return out


@pytest.fixture(scope="module")
def priced_evolve(tmp_path_factory):
    """One AWI condition evolved two cycles by the playbook (replay screening) at known prices."""
    from memloop.optimize.evolve import run_evolve

    root = tmp_path_factory.mktemp("cost")
    config = small_evolve(root, "unit-cost", (2, 1, 1), evolvers=["playbook"], cycles=2)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = priced_roles(fake.base_url, root / "c.sqlite")
        (outcome,) = run_evolve(config, progress=False, clients=roles)
    return config, outcome, roles


def test_each_cycles_evaluations_cost_what_their_calls_cost(priced_evolve):
    from memloop.environment.episode import load_record

    _, outcome, _ = priced_evolve
    for k, record in enumerate(outcome.cycles):
        episodes = outcome.run_dir / f"cycle_{k:02d}" / "episodes"
        rows = [load_record(path).usage for path in sorted(episodes.glob("*/*/record.json"))]
        assert len(rows) == 4 * 3  # every user's periods 0 to 2, on every split
        expected = expected_cost(rows)
        evaluated = {c: v for c, v in record.cost_usd.items() if c != "optimizer"}
        assert evaluated.keys() == expected.keys()
        for component, dollars in expected.items():
            assert evaluated[component] == pytest.approx(dollars), component


def test_a_proposal_costs_its_optimizer_calls_and_its_screening(priced_evolve):
    from memloop.environment.episode import load_record

    _, outcome, _ = priced_evolve
    first = outcome.cycles[0]
    screens = outcome.run_dir / "cycle_00" / "screen"
    screened = [load_record(p).usage for p in sorted(screens.glob("*/*/*/record.json"))]
    screening = expected_cost(screened)
    assert screening.get("memory", 0) > 0, "the playbook screened its candidates by replay"
    screened_tokens = sum(row["total_tokens"] for usage in screened for row in usage.values())
    step = json.loads((outcome.run_dir / "cycle_00" / "evolve.json").read_text())
    optimizer_calls = (step["tokens"] - screened_tokens) / 15  # the step's tokens hold both
    assert optimizer_calls >= 1 and optimizer_calls == int(optimizer_calls)
    assert first.cost_usd["optimizer"] == pytest.approx(
        optimizer_calls * per_call("optimizer") + sum(screening.values())
    )
    assert "optimizer" not in outcome.cycles[-1].cost_usd  # the last cycle proposes nothing


def test_mlflow_and_compare_show_the_runs_cost(priced_evolve, capsys):
    from memloop.experiments.cli import main
    from memloop.runs import tracker

    config, outcome, _ = priced_evolve
    total = sum(sum(r.cost_usd.values()) for r in outcome.cycles)
    mlc = tracker.client(config.tracking_uri)
    run = mlc.get_run(outcome.run_id)
    assert float(run.data.tags["memloop.cost_usd"]) == pytest.approx(total, abs=1e-6)
    history = mlc.get_metric_history(outcome.run_id, "cost_usd/total")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [sum(r.cost_usd.values()) for r in outcome.cycles]
    )
    argv = ["compare", "--experiment", config.experiment, "--tracking-uri", config.tracking_uri]
    assert main([*argv, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    (marginal,) = [r for r in rows if r["table"] == "marginal"]
    assert math.isclose(float(marginal["cost $"]), total, abs_tol=5e-5)


def test_an_evaluations_table_ends_with_its_cost(priced_evolve):
    from memloop.feedback.report import format_metrics

    _, outcome, _ = priced_evolve
    metrics = json.loads((outcome.run_dir / "cycle_00" / "train" / "metrics.json").read_text())
    assert metrics["cost_usd"] and set(metrics["cost_usd"]) <= set(metrics["usage"])
    lines = format_metrics(metrics, "table").splitlines()
    total = sum(metrics["cost_usd"].values())
    assert f"cost: ${format_cost(total)} at the endpoints' prices:" in "\n".join(lines)
    del metrics["cost_usd"]  # no price: no cost line (nothing is shown as free)
    assert "cost:" not in format_metrics(metrics, "table")
