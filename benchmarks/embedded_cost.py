"""What runs on the embedded models cost against what the models alone need (issue 46).

First each embedded model's quiet rates: the model, started through memloop's own client (its
endpoint file, no response cache) in a process of its own, answers one fixed request, a
~600-token prompt and 128 tokens at temperature 0, twice (the first a warm-up; the two differ from
their first word, so the second reuses no prompt prefix from the slot's cache); the second one's
server timings give the prompt-processing and decoding rates of a single stream.

Then each run: a `memloop` command in its own process, in a fresh working folder, with a fresh
MEMLOOP_CACHE_DIR (an empty response cache: no answer comes from it), MEMLOOP_MODELS_DIR set to
the joined model files already there (not joined again) and MEMLOOP_REQUEST_LOG naming a file to
which memloop's chat client appends one JSON line per attempt (memloop/llm/request_log.py). From
those lines, per run: requests sent, cache hits, cancelled, retried and failed attempts; prompt
tokens (reused from the slot's cache / processed) and decoded tokens, in all, per component and
per model; server_busy_s, the server's own prompt + decode milliseconds; model_bound_s, the sum
over the requests of prompt_n / prompt rate + predicted_n / decode rate at the quiet rates of
the request's model, what the models alone need one request at a time; and ratio = wall_s /
model_bound_s, the run's time beyond its model work (start-up, imports, MLflow, embeddings,
cancelled requests) as a factor. The rates are single-stream: requests that overlap are batched
in the server's slots, so wall time can be less than model_bound_s (ratio < 1). in_flight_s is
the time at least one request was in flight (waiting for its turn included), models_idle_s the
rest of the wall time.

Targets (issue 46): ratio <= 1.25 for quickstart, evolve-small and tune-small; no cancelled and no
retried attempt on a quiet machine; two-processes (the quickstart and evolve-small started
together, each as its single run, sharing the machine's embedded servers) finishes both within
1.1 x their combined model-bound time. The embedded servers are shared by every memloop process
using the same models folder: each run records the servers already running when it started
(servers_running_before; none on a quiet machine). Writes benchmarks/results/embedded_cost.json
(with the commit) after every run; prints a Markdown table at the end; progress on stderr.

    .venv/bin/python benchmarks/embedded_cost.py         # quickstart, evolve-small, tune-small
    .venv/bin/python benchmarks/embedded_cost.py --runs two-processes \\
        --rates-from benchmarks/results/embedded_cost.json --out /tmp/two-processes.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "memloop" / "experiments"
RESULTS = Path(__file__).parent / "results" / "embedded_cost.json"
REQUEST_LOG = "MEMLOOP_REQUEST_LOG"

# the models the runs use, each with the endpoint file its runs reach it through (same slots and
# context per slot, so the same server settings)
RATE_ENDPOINTS = {
    "local-0.5b": EXPERIMENTS / "endpoints" / "local-0.5b.yaml",
    "local-1.5b": EXPERIMENTS / "endpoints" / "local.yaml",
}
RATE_COMPONENT = "quiet_rate"
RATE_MAX_TOKENS = 128
RATE_LINES = 30  # ~19 tokens a line: a ~600-token prompt


@dataclass(frozen=True)
class Run:
    name: str
    argv: tuple[str, ...]  # after `memloop`; paths relative to the repository root
    about: str
    target_ratio: float | None = None


RUNS = {
    r.name: r
    for r in (
        Run("quickstart", ("quickstart", "--no-progress"), "memloop quickstart", 1.25),
        Run(
            "evolve-small",
            ("evolve", "memloop/experiments/evolve/complete-small.yaml", "--no-progress"),
            "evolve on complete-small.yaml",
            1.25,
        ),
        Run(
            "tune-small",
            ("tune", "memloop/experiments/tune/awe-small.yaml", "--no-progress"),
            "tune on awe-small.yaml",
            1.25,
        ),
        *(
            Run(
                f"{mode}-small",
                ("evolve", f"memloop/experiments/evolve/{mode}-small.yaml", "--no-progress"),
                f"evolve on {mode}-small.yaml",
            )
            for mode in ("diagnostic", "no-evolution", "question-only")
        ),
    )
}
# the issue's own cases, on small procedural environments made first (ENVIRONMENTS): one AWI
# eval of a user over 3 periods and 3 questions on the 1.5B model (before: 21.9 min, 7 requests
# cancelled at their timeout and asked again), and three tiny evals at once, two on the 0.5B
# model and one on the 1.5B (before: each started its own server; all three failed after 10-16
# minutes, "failed 5 times")
ENVIRONMENTS = {
    "awi": ("--users", "1", "--periods", "2", "--questions", "3", "--seed", "0"),
    "tiny": ("--users", "1", "--periods", "1", "--questions", "1", "--seed", "0"),
}


def _eval(name: str, env: str, *options: str) -> Run:
    policy = "memloop/experiments/policies/awi.yaml"
    argv = ("eval", "--env", f"{{env:{env}}}", "--policy", policy, "--out", "out", *options)
    return Run(name, (*argv, "--no-progress"), f"eval of AWI on the {env} environment")


RUNS.update(
    (r.name, r)
    for r in (
        _eval("eval-awi", "awi"),
        _eval("eval-tiny-0.5b-a", "tiny", "--model", "local-0.5b"),
        _eval("eval-tiny-0.5b-b", "tiny", "--model", "local-0.5b"),
        _eval("eval-tiny-1.5b", "tiny", "--model", "local-1.5b"),
    )
)
PAIRS = {
    "two-processes": ("quickstart", "evolve-small"),
    "three-evals": ("eval-tiny-0.5b-a", "eval-tiny-0.5b-b", "eval-tiny-1.5b"),
}
PAIR_TARGET_RATIO = 1.1  # for two-processes (the target); the others are reported
DEFAULT_RUNS = ("quickstart", "evolve-small", "tune-small")
KNOWN_RUNS = (*RUNS, *PAIRS)


# ------------------------------------------------------------------ the request log, summarized


def model_name(name: str) -> str:
    """The short name of an embedded model under any of its aliases (local-0.5b, local-1.5b);
    any other model's name as it is."""
    from memloop.llm.model_files import MODEL_ALIASES

    packaged = MODEL_ALIASES.get(name)
    if packaged is None:
        return name
    for short in RATE_ENDPOINTS:
        if MODEL_ALIASES[short] == packaged:
            return short
    return packaged.key


def read_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The request log's lines, and how many could not be read (cut off, not JSON)."""
    if not path.exists():
        return [], 0
    lines, unreadable = [], 0
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            unreadable += 1
            continue
        if isinstance(line, dict):
            lines.append(line)
        else:
            unreadable += 1
    return lines, unreadable


def _counts() -> dict[str, Any]:
    return {
        "requests": 0,
        "cache_hits": 0,
        "prompt_tokens": 0,
        "decoded_tokens": 0,
        "reused_prefix_tokens": 0,
        "model_bound_s": 0.0,
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(
    lines: Iterable[dict[str, Any]], rates: dict[str, dict[str, float]], wall_s: float
) -> dict[str, Any]:
    """One run's numbers from its request-log lines.

    `rates` is {model: {"prompt_tok_s", "decode_tok_s"}} (the quiet rates; any alias of an
    embedded model). A sent attempt is a line whose outcome is not cache_hit. Its tokens are
    the server's (prompt_n + cache_n, predicted_n) when the line has timings, else the usage the
    client recorded; its model-bound seconds are prompt_n / prompt rate + predicted_n / decode
    rate (the usage's tokens without timings); a request to a model without rates adds none and
    is counted in unrated_requests.
    """
    rated = {model_name(k): v for k, v in rates.items()}
    out: dict[str, Any] = {
        "wall_s": round(wall_s, 2),
        "requests": 0,
        "cache_hits": 0,
        "cancelled": 0,
        "retried": 0,
        "failed": 0,
        "prompt_tokens": 0,
        "decoded_tokens": 0,
        "reused_prefix_tokens": 0,
        "processed_prompt_tokens": 0,
        "requests_without_timings": 0,
        "unrated_requests": 0,
    }
    busy_ms = bound = waited = 0.0
    intervals: list[tuple[float, float]] = []
    per_component: dict[str, dict[str, Any]] = {}
    per_model: dict[str, dict[str, Any]] = {}
    for line in lines:
        component = str(line.get("component") or "?")
        model = model_name(str(line.get("model") or "?"))
        groups = (
            per_component.setdefault(component, _counts()),
            per_model.setdefault(model, _counts()),
        )
        if line.get("outcome") == "cache_hit":
            out["cache_hits"] += 1
            for group in groups:
                group["cache_hits"] += 1
            continue
        out["requests"] += 1
        outcome = line.get("outcome")
        out["cancelled"] += outcome == "cancelled"
        out["failed"] += outcome == "failed"
        out["retried"] += _number(line.get("attempt")) > 0
        latency = _number(line.get("latency_s"))
        waited += latency
        if "t" in line:
            intervals.append((_number(line["t"]) - latency, _number(line["t"])))
        timings = line.get("timings") if isinstance(line.get("timings"), dict) else None
        if timings is not None:
            reused = int(_number(timings.get("cache_n")))
            processed = int(_number(timings.get("prompt_n")))
            decoded = int(_number(timings.get("predicted_n")))
            prompt = processed + reused
            busy_ms += _number(timings.get("prompt_ms")) + _number(timings.get("predicted_ms"))
        else:
            out["requests_without_timings"] += 1
            reused = 0
            prompt = processed = int(_number(line.get("prompt_tokens")))
            decoded = int(_number(line.get("completion_tokens")))
        rate = rated.get(model)
        seconds = 0.0
        if rate is None:
            out["unrated_requests"] += 1
        else:
            seconds = processed / rate["prompt_tok_s"] + decoded / rate["decode_tok_s"]
        bound += seconds
        out["prompt_tokens"] += prompt
        out["decoded_tokens"] += decoded
        out["reused_prefix_tokens"] += reused
        out["processed_prompt_tokens"] += processed
        for group in groups:
            group["requests"] += 1
            group["prompt_tokens"] += prompt
            group["decoded_tokens"] += decoded
            group["reused_prefix_tokens"] += reused
            group["model_bound_s"] += seconds
    for group in (*per_component.values(), *per_model.values()):
        group["model_bound_s"] = round(group["model_bound_s"], 3)
    in_flight = _union_length(intervals)
    out.update(
        {
            "server_busy_s": round(busy_ms / 1000, 3),
            "model_bound_s": round(bound, 3),
            "ratio": round(wall_s / bound, 3) if bound > 0 else None,
            "in_flight_s": round(in_flight, 3),
            "models_idle_s": round(max(0.0, wall_s - in_flight), 3),
            "mean_in_flight": round(waited / wall_s, 3) if wall_s > 0 else None,
            "per_component": dict(sorted(per_component.items())),
            "per_model": dict(sorted(per_model.items())),
        }
    )
    return out


# ------------------------------------------------------------------ quiet rates


def rate_messages(index: int) -> list[dict[str, str]]:
    """The fixed rate request (index 0: the warm-up, 1: the measured one).

    The two differ from their first word on, so the measured one reuses no prompt prefix the
    warm-up left in the server's slot cache.
    """
    opener = ("Morning", "Evening")[index]
    colours = ("red", "blue", "green", "grey", "white", "black", "yellow")
    things = ("lamp", "chair", "box", "rug", "mirror", "clock", "vase", "shelf", "table", "bench")
    rooms = ("kitchen", "hall", "garden", "attic", "office", "garage", "cellar", "porch")
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    entries = [
        f"Entry {n}: the {colours[(n + index) % 7]} {things[(3 * n + index) % 10]} was moved "
        f"from the {rooms[n % 8]} to the {rooms[(n + 3 + index) % 8]} on {days[(2 * n) % 7]}."
        for n in range(1, RATE_LINES + 1)
    ]
    return [
        {
            "role": "system",
            "content": f"{opener} shift. You keep a moving log: copy its format exactly, one "
            "entry a line, and write nothing else.",
        },
        {
            "role": "user",
            "content": "The log so far:\n"
            + "\n".join(entries)
            + f"\n\nContinue the log with entries {RATE_LINES + 1} to {RATE_LINES + 40}.",
        },
    ]


def measure_rates_here(model: str) -> None:
    """In a child process whose environment names the request log: the two rate requests."""
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import load_endpoint

    client = ChatClient(load_endpoint(RATE_ENDPOINTS[model]), cache=None)
    try:
        for index in (0, 1):
            client.chat(
                rate_messages(index),
                component=RATE_COMPONENT,
                temperature=0.0,
                max_tokens=RATE_MAX_TOKENS,
            )
    finally:
        client.close()


def _rate(timings: dict[str, Any], per_second: str, count: str, ms: str) -> float | None:
    value = _number(timings.get(per_second))
    if value > 0:
        return value
    if _number(timings.get(ms)) > 0:
        return _number(timings.get(count)) / (_number(timings[ms]) / 1000)
    return None


def quiet_rates(model: str, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """{prompt_tok_s, decode_tok_s, ...} of `model`, measured in a child process."""
    log = folder / "requests.jsonl"
    child_env = {**env, "MEMLOOP_CACHE_DIR": str(folder / "cache"), REQUEST_LOG: str(log)}
    servers = running_servers()
    if servers:
        note(f"{model}: embedded servers already running (not a quiet machine): {servers}")
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--measure-rates", model],
        env=child_env,
        cwd=folder,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"measuring {model}'s rates failed:\n{done.stderr.strip()[-2000:]}")
    lines = [line for line in read_log(log)[0] if line.get("component") == RATE_COMPONENT]
    if not lines:
        raise SystemExit(
            f"measuring {model}'s rates: no request log was written ({log}); this memloop's "
            f"chat client does not write {REQUEST_LOG}"
        )
    measured = lines[-1]
    timings = measured.get("timings")
    if measured.get("outcome") != "ok" or not isinstance(timings, dict):
        raise SystemExit(
            f"measuring {model}'s rates: the measured request has no server timings "
            f"(outcome {measured.get('outcome')}, timings {timings}); see {log}"
        )
    prompt_rate = _rate(timings, "prompt_per_second", "prompt_n", "prompt_ms")
    decode_rate = _rate(timings, "predicted_per_second", "predicted_n", "predicted_ms")
    if not prompt_rate or not decode_rate:
        raise SystemExit(f"measuring {model}'s rates: no rates in the timings {timings}")
    return {
        "prompt_tok_s": round(prompt_rate, 2),
        "decode_tok_s": round(decode_rate, 2),
        "api_model": measured.get("model"),
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "predicted_n": timings.get("predicted_n"),
        "warm_up_latency_s": lines[0].get("latency_s") if len(lines) > 1 else None,
        "latency_s": measured.get("latency_s"),
        "seconds_with_start": round(time.perf_counter() - started, 1),
        "servers_running_before": servers,
    }


# ------------------------------------------------------------------ the runs


def note(text: str) -> None:
    print(f"[embedded_cost {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def command_line(run: Run) -> str:
    return "memloop " + shlex.join(run.argv)


@dataclass
class Started:
    run: Run
    folder: Path
    log: Path
    proc: subprocess.Popen
    started: float
    loadavg: tuple[float, float, float]
    wall_s: float | None = None
    timed_out: bool = False


def start(run: Run, folder: Path, cache: Path, env: dict[str, str], root: Path) -> Started:
    """`memloop <argv>` as its own process in a fresh working folder `folder`/work; `root` holds
    the environment files (make_environments)."""
    work = folder / "work"
    work.mkdir(parents=True)
    log = folder / "requests.jsonl"
    argv = [_argument(a, root) for a in run.argv]
    child_env = {**env, "MEMLOOP_CACHE_DIR": str(cache), REQUEST_LOG: str(log)}
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memloop", *argv],
            cwd=work,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    return Started(run, folder, log, proc, time.perf_counter(), os.getloadavg())


def _argument(value: str, root: Path) -> str:
    """A run's argument: a YAML path from the repository root, `{env:NAME}` the environment file
    made for the runs (make_environments), anything else as it is."""
    if value.startswith("{env:"):
        return str(root / f"env-{value[5:-1]}.json")
    return str(ROOT / value) if value.endswith(".yaml") else value


def make_environments(root: Path, names: Iterable[str], env: dict[str, str]) -> None:
    """The procedural environments the runs `names` evaluate on (no model: the catalogue)."""
    wanted = {
        a[5:-1]
        for n in names
        for r in ([RUNS[x] for x in PAIRS[n]] if n in PAIRS else [RUNS[n]])
        for a in r.argv
        if a.startswith("{env:")
    }
    for name in sorted(wanted):
        out = root / f"env-{name}.json"
        if out.exists():
            continue
        argv = ["env", "procedural", *ENVIRONMENTS[name], "--out", str(out)]
        subprocess.run(
            [sys.executable, "-m", "memloop", *argv],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )


def wait_all(runs: Sequence[Started], label: str, timeout_s: float, every_s: float) -> None:
    """Wait for every process, a progress line every `every_s`; SIGINT (then SIGKILL) at the
    timeout and on Ctrl-C here."""
    began = min(s.started for s in runs)
    shown = time.perf_counter()
    try:
        while any(s.wall_s is None for s in runs):
            time.sleep(0.2)
            now = time.perf_counter()
            for s in runs:
                if s.wall_s is None and s.proc.poll() is not None:
                    s.wall_s = now - s.started
            if now - began > timeout_s:
                note(f"{label}: over {timeout_s:.0f} s, stopping it")
                for s in runs:
                    s.timed_out = s.wall_s is None
                stop(runs)
                break
            if now - shown >= every_s:
                shown = now
                sent = sum(len(read_log(s.log)[0]) for s in runs)
                note(f"{label}: {now - began:.0f} s, {sent} request log lines")
    except KeyboardInterrupt:
        stop(runs)
        raise


def stop(runs: Sequence[Started]) -> None:
    for s in runs:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGINT)  # memloop stops within a second (ctrl_c.py)
    for s in runs:
        try:
            s.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
        if s.wall_s is None:
            s.wall_s = time.perf_counter() - s.started


def result_of(s: Started, rates: dict[str, dict[str, float]]) -> dict[str, Any]:
    assert s.wall_s is not None
    lines, unreadable = read_log(s.log)
    row: dict[str, Any] = {
        "name": s.run.name,
        "command": command_line(s.run),
        "exit": s.proc.returncode,
        "timed_out": s.timed_out,
        "loadavg_before": [round(x, 2) for x in s.loadavg],
        **summarize(lines, rates, s.wall_s),
        "unreadable_log_lines": unreadable,
    }
    if s.proc.returncode != 0:
        err = (s.folder / "stderr.txt").read_text(encoding="utf-8", errors="replace")
        row["stderr_tail"] = err.strip()[-1500:]
    return row


def run_single(
    run: Run, root: Path, env: dict[str, str], rates: dict, args: argparse.Namespace
) -> dict[str, Any]:
    folder = root / run.name
    note(f"{run.name}: {command_line(run)} (in {folder / 'work'})")
    servers = running_servers()
    if servers:
        note(f"{run.name}: embedded servers already running (not a quiet machine): {servers}")
    started = start(run, folder, folder / "cache", env, root)
    wait_all([started], run.name, args.timeout, args.progress_every)
    row = result_of(started, rates)
    row["servers_running_before"] = servers
    note(f"{run.name}: exit {row['exit']} after {row['wall_s']:.0f} s, ratio {row['ratio']}")
    return row


def run_pair(
    name: str, root: Path, env: dict[str, str], rates: dict, args: argparse.Namespace
) -> dict[str, Any]:
    """Both runs of the pair started together, each as its single run (its own fresh working
    folder, cache folder and log); they share the machine's embedded servers."""
    runs = [RUNS[n] for n in PAIRS[name]]
    folder = root / name
    note(f"{name}: " + " & ".join(command_line(r) for r in runs))
    servers = running_servers()
    started = [start(r, folder / r.name, folder / r.name / "cache", env, root) for r in runs]
    wait_all(started, name, args.timeout, args.progress_every)
    wall = max(s.wall_s or 0.0 for s in started)
    parts = [result_of(s, rates) for s in started]
    lines = [line for s in started for line in read_log(s.log)[0]]
    row = {
        "name": name,
        "command": " & ".join(command_line(r) for r in runs),
        "exit": max((p["exit"] for p in parts), key=abs),
        "loadavg_before": parts[0]["loadavg_before"],
        "servers_running_before": servers,
        **summarize(lines, rates, wall),
        "processes": parts,
    }
    note(f"{name}: exits {[p['exit'] for p in parts]} after {wall:.0f} s, ratio {row['ratio']}")
    return row


# ------------------------------------------------------------------ targets, report


def targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each target the issue sets for the runs measured: its value and whether it was met (None:
    not measurable)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = row["name"]
        if name in PAIRS:
            limit = PAIR_TARGET_RATIO if name == "two-processes" else None
        else:
            limit = RUNS[name].target_ratio
        failed = row["exit"] != 0
        if limit is not None:
            ratio = row["ratio"]
            out[f"{name}: ratio <= {limit}"] = {
                "value": ratio,
                "met": False if failed else (None if ratio is None else ratio <= limit),
                **({"note": f"exit {row['exit']}"} if failed else {}),
            }
        waste = row["cancelled"] + row["retried"]
        out[f"{name}: cancelled + retried == 0"] = {"value": waste, "met": waste == 0}
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(document: dict[str, Any]) -> str:
    heads = [
        "run",
        "wall s",
        "model-bound s",
        "ratio",
        "models idle s",
        "requests",
        "cache hits",
        "cancelled",
        "retried",
        "failed",
        "prompt tokens (reused)",
        "decoded tokens",
        "server busy s",
        "exit",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in document["runs"]:
        cells = [
            row["name"],
            row["wall_s"],
            row["model_bound_s"],
            row["ratio"],
            row["models_idle_s"],
            row["requests"],
            row["cache_hits"],
            row["cancelled"],
            row["retried"],
            row["failed"],
            f"{_cell(row['prompt_tokens'])} ({_cell(row['reused_prefix_tokens'])})",
            row["decoded_tokens"],
            row["server_busy_s"],
            row["exit"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    rates = ", ".join(
        f"{m} {r['prompt_tok_s']:.0f} prompt / {r['decode_tok_s']:.1f} decode tokens/s"
        for m, r in document["server_rates"].items()
    )
    lines += ["", f"Quiet single-stream rates: {rates}.", ""]
    for name, target in document["targets"].items():
        met = {True: "met", False: "not met", None: "not measured"}[target["met"]]
        extra = f" ({target['note']})" if "note" in target else ""
        lines.append(f"- {name}: {_cell(target['value'])}, {met}{extra}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the machine, the commit


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "MEMLOOP_THREADS": os.environ.get("MEMLOOP_THREADS"),
        "servers_running_at_start": running_servers(),
    }
    try:
        for raw in Path("/proc/cpuinfo").read_text().splitlines():
            if raw.startswith("model name"):
                info["cpu"] = raw.split(":", 1)[1].strip()
                break
        for raw in Path("/proc/meminfo").read_text().splitlines():
            if raw.startswith("MemTotal:"):
                info["memory_gib"] = round(int(raw.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    return info


def running_servers() -> list[dict[str, Any]]:
    """The embedded model servers running on this machine (any user's memloop process): pid and
    model file, from /proc."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if "memloop.llm.embedded_server" not in words:
            continue
        model = words[words.index("--model") + 1] if "--model" in words[:-1] else None
        found.append({"pid": int(proc.name), "model": model and Path(model).name})
    return sorted(found, key=lambda s: s["pid"])


def commit() -> dict[str, Any]:
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    changed = [line[3:] for line in (status or "").splitlines()]
    return {
        "sha": sha.strip() if sha else None,
        "dirty": None if status is None else bool(changed),
        "changed_files": changed[:50],
    }


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    runs_help = "\n".join(f"  {r.name:20s} {command_line(r)}" for r in RUNS.values()) + "".join(
        f"\n  {name:20s} {' and '.join(pair)} started together" for name, pair in PAIRS.items()
    )
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"runs:\n{runs_help}",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        default=list(DEFAULT_RUNS),
        metavar="RUN",
        help=f"the runs, in order (default: {' '.join(DEFAULT_RUNS)})",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="the JSON file to write (default: %(default)s)"
    )
    parser.add_argument(
        "--rates-from",
        type=Path,
        metavar="JSON",
        help="take server_rates from an earlier result instead of measuring them",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="folder for the runs' working, cache and log folders (default: a new temp folder)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (kept anyway when a run failed)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=7200,
        help="seconds before a run is stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=60,
        help="seconds between progress lines (default: %(default)s)",
    )
    parser.add_argument("--measure-rates", choices=list(RATE_ENDPOINTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [name for name in args.runs if name not in KNOWN_RUNS]
    if unknown:
        parser.error(f"unknown run name(s): {', '.join(unknown)}; known: {', '.join(KNOWN_RUNS)}")
    args.runs = list(dict.fromkeys(args.runs))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure_rates:
        measure_rates_here(args.measure_rates)
        return 0
    from memloop.llm.model_files import models_dir

    env = dict(os.environ)
    env.pop(REQUEST_LOG, None)
    # the joined model files of this user's cache, reused; everything else fresh per run
    env["MEMLOOP_MODELS_DIR"] = str(models_dir())
    root = args.work or Path(tempfile.mkdtemp(prefix="embedded-cost-"))
    root.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    document: dict[str, Any] = {
        "commit": commit(),
        "machine": machine(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "models_dir": env["MEMLOOP_MODELS_DIR"],
        "notes": [
            "model_bound_s uses single-stream quiet rates: requests that overlap are batched in "
            "the server's slots, so wall_s can be less than model_bound_s (ratio < 1)",
            "requests = attempts sent (outcome != cache_hit); tokens from the server's timings "
            "(prompt_n + cache_n, predicted_n), else the usage",
            "each run in a fresh working folder with a fresh MEMLOOP_CACHE_DIR (an empty "
            "response cache); the joined model files reused through MEMLOOP_MODELS_DIR",
            "servers_running_before: embedded servers (any memloop process's) running when a "
            "run started; a quiet machine has none",
        ],
    }
    if args.rates_from:
        rates = json.loads(args.rates_from.read_text())["server_rates"]
        note(f"server rates from {args.rates_from}")
    else:
        rates = {}
        for model in RATE_ENDPOINTS:
            note(f"quiet rates of {model}")
            folder = root / f"rates-{model}"
            folder.mkdir(parents=True, exist_ok=True)
            rates[model] = quiet_rates(model, folder, env)
            note(
                f"{model}: {rates[model]['prompt_tok_s']:.0f} prompt, "
                f"{rates[model]['decode_tok_s']:.1f} decode tokens/s"
            )
    document["server_rates"] = rates
    make_environments(root, args.runs, env)
    rows: list[dict[str, Any]] = []
    for name in args.runs:
        try:
            if name in PAIRS:
                rows.append(run_pair(name, root, env, rates, args))
            else:
                rows.append(run_single(RUNS[name], root, env, rates, args))
        except KeyboardInterrupt:
            note(
                f"interrupted during {name}; {args.out} holds the runs before it; work folder "
                f"kept: {root}"
            )
            return 130
        # written after every run: an interrupted benchmark keeps the runs it finished
        document.update(runs=rows, targets=targets(rows))
        document["total_s"] = round(time.perf_counter() - began, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown(document))
    print(f"\nwrote {args.out}")
    failed = [r["name"] for r in rows if r["exit"] != 0]
    if args.keep or failed:
        note(f"work folder kept: {root}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    elif args.work is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        note("interrupted")
        sys.exit(130)
