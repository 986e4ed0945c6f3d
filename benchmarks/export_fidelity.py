"""Does an exported prompt keep its score where it runs? `export --check` on the 1.5B (issue 59).

The question, fixed before the run: an AWE run's selected prompts (here the seed: one cycle, no
evolution; the check is about the runtime, not the prompt) are exported as text, a DSPy program
and a mem0 config, and each is re-scored where it runs on the run's test users, paired with the
run's own per-user scores:
- text: the run's policy with `prompts_from:` the file (memloop's own runtime: expected identical);
- dspy: `dspy.load` of the whole program (AWE: mem0 sends the loaded program's prompts; expected
  identical);
- mem0: mem0's own `Memory.from_config` of the exported config, with its own OpenAI client at the
  run's agent endpoint: `response_format: json_object` and mem0's own parsing instead of memloop's
  JSON schemas, no response cache, mem0's default top_p; the replies and the state probes go
  through memloop as in the run. This is where a gap can appear.

Design: the embedded Qwen2.5-Coder-1.5B (started once; served to both runtimes at one loopback
address with its per-start secret, read from an environment variable, never written) for every
role; a procedural environment (seed 7) of 1 training, 1 validation and TEST_USERS test users,
each 2 questions, period 0 and 1 update period, 1 round per session; objective state_prob (the
letter read). Per-user paired SD of real prompt changes on this writer is about 0.045
(state_prob_power.json), so 6 users detect a gap of `detectable_effect(6, 0.045)` (about 0.06) at
80% power; a smaller gap is reported as not shown, not as absent.

    .venv/bin/python benchmarks/export_fidelity.py --work /tmp/fidelity

Writes benchmarks/results/export_fidelity.json (with the commit); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedded_cost import commit  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "export_fidelity.json"
TEST_USERS = 6
PAIRED_SD = 0.045  # state_prob's per-user paired SD of real prompt changes (the 1.5B writer)
KEY_ENV = "MEMLOOP_FIDELITY_KEY"  # holds the embedded server's per-start secret, in this process
FORMATS = {"text": "prompts.txt", "dspy": "program.json", "mem0": "mem0.json"}


def main(argv: list[str] | None = None) -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    import yaml

    from memloop.core.stats import detectable_effect
    from memloop.experiments.cli import main as memloop
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="working folder (runs, exports, stores)")
    parser.add_argument("--test-users", type=int, default=TEST_USERS)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    # one embedded 1.5B server, reached as a served endpoint (mem0 needs an address to call)
    local = ChatClient(Endpoint(model="local-1.5b"), cache=None)
    base_url = local.resolved_base_url()
    os.environ[KEY_ENV] = local._server.key  # this process only; the files name the variable
    endpoint = {
        "model": _served_model(base_url, local._server.key),
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "logprobs": True,
        "context_window": 8192,
        "max_tokens": 384,
        "max_concurrency": 2,
        "timeout_s": 900,
    }
    (work / "endpoint.yaml").write_text(yaml.safe_dump(endpoint))
    (work / "awe.yaml").write_text("type: awe\n")
    uri = f"sqlite:///{work.resolve()}/mlruns/mlflow.db"
    config = {
        "experiment": "export-fidelity",
        "environment": {
            "procedural": {
                "users": 2 + args.test_users,
                "periods": 1,
                "questions": 2,
                "seed": 7,
            },
            "train_users": 1,
            "val_users": 1,
            "test_users": args.test_users,
        },
        "policy": "awe.yaml",
        "feedback_modes": ["none"],
        "evolvers": ["none"],
        "cycles": 1,
        "objective": "state_prob",
        "rounds": {"init": 1, "update": 1},
        "endpoints": {r: "endpoint.yaml" for r in ("agent", "user_sim", "checker", "optimizer")},
        "tracking_uri": uri,
        "out_dir": str(work / "runs"),
        "parallel_users": 2,
    }
    (work / "evolve.yaml").write_text(yaml.safe_dump(config))
    # the run and its checks share one response cache (MEMLOOP_CACHE_DIR's): the text and DSPy
    # checks are then served the run's answers (the run of b953d75 gave the checks a new file)
    os.environ["MEMLOOP_CACHE_DIR"] = str(work / "cache")
    print(f"[fidelity] the run: {2 + args.test_users} users on the 1.5B", file=sys.stderr)
    if memloop(["evolve", str(work / "evolve.yaml")]) != 0:
        return 1
    (run_dir,) = (work / "runs").glob("awe-*")
    checks = []
    for fmt, name in FORMATS.items():
        print(f"[fidelity] export --check, format {fmt}", file=sys.stderr)
        out = work / name
        argv = ["export", str(run_dir), "--format", fmt, "--out", str(out), "--check"]
        argv += ["--api-key-env", KEY_ENV, "--tracking-uri", uri]
        t0 = time.monotonic()
        if memloop(argv) != 0:
            return 1
        checks.append({**_recorded(fmt, out), "seconds": round(time.monotonic() - t0, 1)})
    result = {
        "commit": commit(),
        "design": {
            "model": "local-1.5b (every role)",
            "policy": "awe (mem0 1.x), the seed prompts (cycle 0)",
            "environment": config["environment"],
            "rounds": config["rounds"],
            "objective": "state_prob",
            "paired_sd_assumed": PAIRED_SD,
            "detectable_gap_80pct": round(detectable_effect(args.test_users, PAIRED_SD), 3),
        },
        "checks": checks,
        "wall_s": round(time.monotonic() - started, 1),
    }
    Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
    for check in checks:
        print(check["summary"])
    print(f"wrote {args.results}", file=sys.stderr)
    return 0


def _served_model(base_url: str, key: str) -> str:
    """The name the embedded server lists its model by (a served endpoint names it so)."""
    import urllib.request

    request = urllib.request.Request(
        f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return str(json.load(answer)["data"][0]["id"])


def _recorded(fmt: str, out: Path) -> dict[str, Any]:
    """The check of the export at `out`, as its folder records it (`<name>.check/check.json`)."""
    from memloop.optimize.export_check import CHECK_FILE, check_folder

    check = json.loads((check_folder(out) / CHECK_FILE).read_text())
    assert check["format"] == fmt
    keep = ("format", "runtime", "objective", "users", "identical", "gap", "summary")
    return {k: check[k] for k in keep} | {
        "memloop_mean": _mean(check["memloop"]),
        "export_mean": _mean(check["export"]),
    }


def _mean(values: dict[str, float]) -> float | None:
    return round(sum(values.values()) / len(values), 4) if values else None


if __name__ == "__main__":
    sys.exit(main())
