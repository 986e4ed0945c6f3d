"""benchmarks/embedded_cost.py's arithmetic, model-free: request-log lines -> a run's summary
(every expected number worked out by hand below), its targets, its run names; and the small
experiment files it runs load with memloop's own loader."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from memloop.testing.paths import REPO

ROOT = REPO


def _load_benchmark():
    name = "benchmarks_embedded_cost"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "benchmarks" / "embedded_cost.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


ec = _load_benchmark()

RATES = {
    "local-0.5b": {"prompt_tok_s": 100.0, "decode_tok_s": 20.0},
    "local-1.5b": {"prompt_tok_s": 50.0, "decode_tok_s": 10.0},
}


def line(component, model, outcome, attempt, t, latency, timings=None, prompt=0, completion=0):
    return {
        "t": t,
        "pid": 1,
        "component": component,
        "model": model,
        "local": model != "gpt-x",
        "outcome": outcome,
        "attempt": attempt,
        "latency_s": latency,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "timings": timings,
    }


def timings(cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms):
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "prompt_per_second": 1000 * prompt_n / prompt_ms,
        "predicted_per_second": 1000 * predicted_n / predicted_ms,
    }


QWEN_05 = "qwen2.5-coder-0.5b-instruct-q4_k_m"  # the API name the client logs
LINES = [
    # 1: 300 prompt tokens reused, 200 processed (2 s at 100/s), 40 decoded (2 s at 20/s): 4 s
    line("agent", QWEN_05, "ok", 0, 100.0, 2.0, timings(300, 200, 1500, 40, 1800)),
    # 2: the same answer from the response cache: no request
    line("agent", QWEN_05, "cache_hit", 0, 101.0, 0.0, prompt=500, completion=40),
    # 3: given up (stalled server), no tokens; 4: its retry, 100 / 50 + 50 / 10 = 7 s
    line("optimizer", "local-1.5b", "cancelled", 0, 110.0, 5.0),
    line("optimizer", "local-1.5b", "ok", 1, 120.0, 8.0, timings(0, 100, 2000, 50, 5000)),
    # 5: a failed attempt; 6: its retry without server timings: usage 80 / 100 + 10 / 20 = 1.3 s
    line("probe", "local-0.5b", "failed", 0, 119.0, 1.0),
    line("probe", "local-0.5b", "ok", 1, 121.0, 1.0, prompt=80, completion=10),
    # 7: a model without quiet rates: tokens counted, no model-bound seconds
    line("generator", "gpt-x", "ok", 0, 130.0, 0.5, prompt=10, completion=5),
]


def test_summary_of_hand_made_lines():
    s = ec.summarize(LINES, RATES, wall_s=24.6)
    assert s["requests"] == 6  # every line but the cache hit
    assert (s["cache_hits"], s["cancelled"], s["failed"], s["retried"]) == (1, 1, 1, 2)
    assert s["prompt_tokens"] == 500 + 100 + 80 + 10
    assert s["decoded_tokens"] == 40 + 50 + 10 + 5
    assert s["reused_prefix_tokens"] == 300
    assert s["processed_prompt_tokens"] == 200 + 100 + 80 + 10
    assert s["requests_without_timings"] == 4  # lines 3, 5, 6, 7
    assert s["unrated_requests"] == 1
    assert s["server_busy_s"] == pytest.approx((1500 + 1800 + 2000 + 5000) / 1000)
    assert s["model_bound_s"] == pytest.approx(4 + 7 + 1.3)
    assert s["ratio"] == pytest.approx(24.6 / 12.3, abs=1e-3)
    # in flight: [98, 100], [105, 110], [112, 120] with [118, 119] and [120, 121], [129.5, 130]
    assert s["in_flight_s"] == pytest.approx(2 + 5 + 9 + 0.5)
    assert s["models_idle_s"] == pytest.approx(24.6 - 16.5)
    assert s["mean_in_flight"] == pytest.approx((2 + 5 + 8 + 1 + 1 + 0.5) / 24.6, abs=1e-3)
    assert s["per_component"] == {
        "agent": {
            "requests": 1,
            "cache_hits": 1,
            "prompt_tokens": 500,
            "decoded_tokens": 40,
            "reused_prefix_tokens": 300,
            "model_bound_s": 4.0,
        },
        "generator": {
            "requests": 1,
            "cache_hits": 0,
            "prompt_tokens": 10,
            "decoded_tokens": 5,
            "reused_prefix_tokens": 0,
            "model_bound_s": 0.0,
        },
        "optimizer": {
            "requests": 2,
            "cache_hits": 0,
            "prompt_tokens": 100,
            "decoded_tokens": 50,
            "reused_prefix_tokens": 0,
            "model_bound_s": 7.0,
        },
        "probe": {
            "requests": 2,
            "cache_hits": 0,
            "prompt_tokens": 80,
            "decoded_tokens": 10,
            "reused_prefix_tokens": 0,
            "model_bound_s": 1.3,
        },
    }
    # the API name and the endpoint's alias are one model
    assert set(s["per_model"]) == {"local-0.5b", "local-1.5b", "gpt-x"}
    assert s["per_model"]["local-0.5b"] == {
        "requests": 3,
        "cache_hits": 1,
        "prompt_tokens": 580,
        "decoded_tokens": 50,
        "reused_prefix_tokens": 300,
        "model_bound_s": 5.3,
    }
    assert s["per_model"]["local-1.5b"]["model_bound_s"] == 7.0


def test_rates_under_the_api_name_apply_to_the_alias():
    rates = {QWEN_05: RATES["local-0.5b"]}
    s = ec.summarize(LINES[:1], rates, wall_s=4.0)
    assert s["model_bound_s"] == pytest.approx(4.0) and s["ratio"] == pytest.approx(1.0)


def test_no_requests_no_ratio():
    s = ec.summarize([], RATES, wall_s=3.0)
    assert s["requests"] == 0 and s["model_bound_s"] == 0 and s["ratio"] is None
    assert s["models_idle_s"] == 3.0


def test_read_log_skips_a_cut_line(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(LINES[0]) + "\n" + json.dumps(LINES[2])[:20] + "\n\n")
    lines, unreadable = ec.read_log(path)
    assert lines == [LINES[0]] and unreadable == 1
    assert ec.read_log(tmp_path / "missing.jsonl") == ([], 0)


def test_targets_met_and_not_met():
    def row(name, ratio, exit=0, cancelled=0, retried=0):
        return {
            "name": name,
            "ratio": ratio,
            "exit": exit,
            "cancelled": cancelled,
            "retried": retried,
        }

    rows = [
        row("quickstart", 1.2),
        row("evolve-small", 1.3, retried=1),
        row("tune-small", 1.1, exit=1),
        row("two-processes", 1.05),
        row("no-evolution-small", 2.0),  # no ratio target
    ]
    t = ec.targets(rows)
    assert t["quickstart: ratio <= 1.25"]["met"] is True
    assert t["evolve-small: ratio <= 1.25"]["met"] is False
    assert t["evolve-small: cancelled + retried == 0"] == {"value": 1, "met": False}
    assert t["tune-small: ratio <= 1.25"]["met"] is False  # a failed run meets nothing
    assert t["two-processes: ratio <= 1.1"]["met"] is True
    assert "no-evolution-small: ratio <= 1.25" not in t
    assert t["no-evolution-small: cancelled + retried == 0"]["met"] is True
    assert "quickstart" in ec.markdown({"runs": [], "server_rates": RATES, "targets": t})


def test_unknown_run_names_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ec.parse_args(["--runs", "quickstart", "quikstart"])
    assert exit_info.value.code == 2
    assert "unknown run name(s): quikstart" in capsys.readouterr().err
    assert ec.parse_args(["--runs", "tune-small", "tune-small"]).runs == ["tune-small"]
    assert ec.parse_args([]).runs == ["quickstart", "evolve-small", "tune-small"]


def test_rate_requests_share_no_prompt_prefix():
    warm_up, measured = ec.rate_messages(0), ec.rate_messages(1)
    assert warm_up[0]["content"].split()[0] != measured[0]["content"].split()[0]
    assert len(measured[1]["content"]) > 1500  # a prompt of some 600 tokens


def test_the_small_experiment_files_load_and_are_smaller():
    from memloop.optimize.config import EvolveConfig, TuneConfig, load_config

    experiments = ROOT / "memloop" / "experiments"
    pairs = [
        (experiments / "evolve" / f"{mode}.yaml", experiments / "evolve" / f"{mode}-small.yaml")
        for mode in ("complete", "diagnostic", "no-evolution", "question-only")
    ]
    pairs.append((experiments / "tune" / "awe.yaml", experiments / "tune" / "awe-small.yaml"))
    for big_path, small_path in pairs:
        cls = TuneConfig if "tune" in big_path.parts else EvolveConfig
        big, small = load_config(big_path, cls), load_config(small_path, cls)
        assert small.environment.procedural.seed == big.environment.procedural.seed
        for split in ("train", "val", "test"):
            assert small.environment.sizes()[split] <= big.environment.sizes()[split]
            assert (small.environment.sizes()[split] > 0) == (big.environment.sizes()[split] > 0)
        assert small.policy == big.policy
    for run in ec.RUNS.values():  # every run's experiment file exists
        for arg in run.argv:
            assert not arg.endswith(".yaml") or (ROOT / arg).is_file()


def test_every_shipped_experiment_states_its_measured_wall_time():
    """Each small file and the quickstart state the wall time of their run in the benchmark's
    result; every other experiment file states an estimate. A later run of one case alone
    (`embedded_cost_quickstart.json`: the quickstart after issue 42 changed it) stands for
    that case."""
    import json

    experiments = ROOT / "memloop" / "experiments"
    walls = {}
    for name in ("embedded_cost.json", "embedded_cost_quickstart.json"):
        result = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
        walls |= {row["name"]: row["wall_s"] for row in result["runs"]}
    files = {"quickstart": experiments / "quickstart.yaml"}
    for run in ec.RUNS.values():
        yaml = [ROOT / a for a in run.argv if a.endswith(".yaml")]
        if yaml:
            files[run.name] = yaml[0]
    measured = {name: path for name, path in files.items() if name in walls}
    assert set(measured) >= {"quickstart", "evolve-small", "tune-small"}
    for name, path in measured.items():
        text = path.read_text()
        wall = walls[name]
        stated = f"# Expected wall time on the 2-core machine: {wall / 60:.1f} min ({wall:.0f} s"
        assert stated in text, (path, stated)
    shipped = [experiments / "quickstart.yaml", *experiments.glob("evolve/*.yaml")]
    shipped += experiments.glob("tune/*.yaml")
    for path in shipped:
        assert "# Expected wall time on the 2-core machine: " in path.read_text(), path
