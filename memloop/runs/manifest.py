"""A run's manifest, and `memloop rerun`: what it takes to make the run again, and a rerun.

Every run folder a command opens (runs/folder.open_run_folder) gets `manifest.json` beside its
spec.json: the command line as typed and the folder it ran from, the commit (and whether the
checkout had uncommitted changes), the run's spec (resolved config, users, seeds, endpoints
without secrets: spec.json's document), the embedded models' file sha256 of the endpoints that
use one, the response-cache policy (the `--cache` given, else the default file and
`MEMLOOP_CACHE_DIR`), Python and package versions. A benchmark's result JSON carries the same
record under `manifest` (`manifest()` without a spec).

`rerun(manifest, out)` runs the recorded command again with its output in `out` (and its MLflow
store inside it), then compares: for an eval, metrics.json and each user's scores; for the
quickstart, every run folder's cycle records. The verdict is `identical` (every user's every
score equal: a rerun served from the response cache) or, per run, the rerun's mean objective
within or outside the original's 95% t interval.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
_COMMAND: list[str] | None = None  # the memloop command line of this process (cli.main sets it)
RERUNNABLE = ("eval", "quickstart")
# metrics.json keys that differ between two runs of the same work: the tokens the response
# cache served
VOLATILE = ("usage_cached",)


def set_command(argv: list[str] | None) -> None:
    """Record the running command line (`memloop` and its arguments; None: none runs)."""
    global _COMMAND
    _COMMAND = None if argv is None else ["memloop", *argv]


def _model_files(endpoints: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per role with an embedded model: its file name and sha256 (verified before each load)."""
    from memloop.llm.model_files import MODEL_ALIASES

    out = {}
    for role, settings in endpoints.items():
        if settings.get("base_url") == "local" and settings.get("model") in MODEL_ALIASES:
            model = MODEL_ALIASES[settings["model"]]
            out[role] = {"file": model.file_name, "sha256": model.sha256}
    return out


def _cache_policy(command: list[str] | None) -> dict[str, Any]:
    from memloop.llm.client import default_cache_path

    given = None
    if command and "--cache" in command[:-1]:
        given = command[command.index("--cache") + 1]
    return {
        "cache_option": given,
        "default_cache": str(default_cache_path()),
        "MEMLOOP_CACHE_DIR": os.environ.get("MEMLOOP_CACHE_DIR"),
        "rule": "every response is cached by its request; a rerun with the same cache file asks "
        "the model nothing it answered before",
    }


def manifest(spec: Any = None, command: list[str] | None = None) -> dict[str, Any]:
    """The manifest of this process's run of `spec` (None: a benchmark's result, no spec)."""
    from memloop.runs.spec import git_dirty, git_revision, versions

    command = command if command is not None else _COMMAND or ["python", *sys.argv]
    document = None if spec is None else spec.document()
    return {
        "format": MANIFEST_FORMAT,
        "command": command,
        "cwd": os.getcwd(),
        "commit": git_revision(),
        "dirty": git_dirty(),
        "python": sys.version.split()[0],
        "packages": versions(),
        "spec": document,
        "models": {} if spec is None else _model_files(spec.endpoints),
        "cache": _cache_policy(command),
    }


def write_manifest(folder: Path, spec: Any) -> None:
    """`folder`/manifest.json for `spec`'s run (by a memloop command line, else not at all)."""
    if _COMMAND is not None:
        atomic_write_json(Path(folder) / MANIFEST_FILE, manifest(spec), indent=1)


# -- rerun --------------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any]:
    import json

    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise UserError(f"{path}: not a memloop manifest (format {MANIFEST_FORMAT})")
    return data


def _option(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv[:-1]):
        if word == name:
            return argv[i + 1]
    return None


def _replaced(argv: list[str], name: str, value: str) -> list[str]:
    if name in argv[:-1]:
        i = argv.index(name)
        return [*argv[:i], name, value, *argv[i + 2 :]]
    return [*argv, name, value]


def rerun_argv(data: dict[str, Any], out: Path) -> tuple[list[str], Path]:
    """(the memloop arguments of the rerun, the original's output folder); one line if none."""
    command = list(data.get("command") or [])
    if not command or command[0] != "memloop" or len(command) < 2:
        raise UserError(f"the manifest's command {command} is not a memloop command line")
    argv = command[1:]
    if argv[0] not in RERUNNABLE:
        raise UserError(
            f"rerun knows {' and '.join(RERUNNABLE)}; run `{' '.join(command)}` again by hand "
            f"from {data.get('cwd')}"
        )
    cwd = Path(data.get("cwd") or ".")
    original = _option(argv, "--out")
    if original is None:
        original = "runs/quickstart"  # quickstart's default
    argv = _replaced(argv, "--out", str(out))
    argv = _replaced(argv, "--tracking-uri", f"sqlite:///{out.resolve()}/mlruns/mlflow.db")
    return argv, (cwd / original).resolve()


def _per_user_of_eval(folder: Path) -> dict[str, dict[str, float]]:
    """{user: numbers} of an eval folder's metrics.json."""
    import json

    data = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    return {u: _numbers(v) for u, v in data.get("per_user", {}).items()}


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float)}


def _per_user_of_runs(folder: Path) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """{run folder name: {"cycle K": {user: numbers}}} of every run folder under `folder`."""
    from memloop.runs.store import CycleStore

    out: dict[str, Any] = {}
    for run in sorted(p for p in folder.iterdir() if (p / "spec.json").is_file()):
        store = CycleStore(run)
        for k in range(store.finished()):
            record = store.record(k)
            if record is None:
                continue
            for split, result in record.splits.items():
                cell = out.setdefault(run.name, {}).setdefault(f"cycle {k} {split}", {})
                for user, row in result.per_user.items():
                    cell[user] = _numbers(row)
    return out


def compare_runs(kind: str, original: Path, again: Path, objective: str) -> dict[str, Any]:
    """Per unit (the eval; or run, cycle and split): identical, or the rerun vs the original.

    Not identical: the rerun's mean objective against the original's 95% t interval.
    """
    from memloop.core.stats import Paired, t_interval

    units: dict[str, tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]]
    if kind == "eval":
        units = {"eval": (_per_user_of_eval(original), _per_user_of_eval(again))}
    else:
        b, a = _per_user_of_runs(original), _per_user_of_runs(again)
        units = {
            f"{run} {cell}": (users, a.get(run, {}).get(cell, {}))
            for run, cells in b.items()
            for cell, users in cells.items()
        }
    report: dict[str, Any] = {}
    for name, (old, new) in units.items():
        if old == new:
            report[name] = {"identical": True}
            continue
        metric = objective if any(objective in r for r in old.values()) else "overall"
        olds = {u: r[metric] for u, r in old.items() if metric in r}
        news = {u: r[metric] for u, r in new.items() if metric in r}
        ci = t_interval(list(olds.values()))
        mean = sum(news.values()) / len(news) if news else None
        report[name] = {
            "identical": False,
            "metric": metric,
            "original_ci95": ci,
            "rerun_mean": mean,
            "within": None if ci is None or mean is None else ci[0] <= mean <= ci[1],
            "paired": Paired.of(news, olds).to_dict(),
        }
    return report


def rerun(path: Path, out: Path) -> dict[str, Any]:
    """Run the manifest at `path` again into `out`; the comparison with the original.

    The command runs as its own process (`python -m memloop`), from the folder it first ran in,
    with this process's environment (so the same response cache).
    """
    import subprocess

    data = read_manifest(path)
    out = Path(out).resolve()
    argv, original = rerun_argv(data, out)
    if out == original:
        raise UserError(f"--out {out}: the original's own folder; give a new one")
    if not original.is_dir():
        raise UserError(f"the original's output {original} is gone; nothing to compare with")
    code = subprocess.run(
        [sys.executable, "-m", "memloop", *argv], cwd=data.get("cwd") or None, check=False
    ).returncode
    if code != 0:
        raise UserError(f"the rerun `memloop {' '.join(argv)}` failed (exit {code})")
    objective = ((data.get("spec") or {}).get("spec") or {}).get("objective") or "state_prob"
    report = compare_runs(argv[0], original, out, objective)
    result: dict[str, Any] = {
        "manifest": str(path),
        "command": ["memloop", *argv],
        "original": str(original),
        "rerun": str(out),
        "identical": all(r["identical"] for r in report.values()) and bool(report),
        "units": report,
    }
    if argv[0] == "eval":
        result["metrics_json_differs"] = _metrics_differ(original, out)
        result["identical"] = result["identical"] and not result["metrics_json_differs"]
    atomic_write_json(out / "rerun.json", result, indent=1)
    return result


def _metrics_differ(original: Path, again: Path) -> list[str]:
    """The keys of metrics.json that differ between two eval folders (but VOLATILE's)."""
    import json

    a, b = (json.loads((f / "metrics.json").read_text(encoding="utf-8")) for f in (original, again))
    return sorted(k for k in set(a) | set(b) if k not in VOLATILE and a.get(k) != b.get(k))


def rerun_lines(result: dict[str, Any]) -> list[str]:
    """What `memloop rerun` prints: one line per unit, then the verdict."""
    lines = []
    for name, r in result["units"].items():
        if r["identical"]:
            lines.append(f"{name}: identical (every user's every score)")
        else:
            ci = r["original_ci95"]
            where = "n/a" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
            inside = {True: "within", False: "OUTSIDE", None: "not comparable to"}[r["within"]]
            lines.append(
                f"{name}: rerun mean {r['metric']} {r['rerun_mean']} {inside} the original's "
                f"95% interval {where}"
            )
    if result.get("metrics_json_differs"):
        lines.append(f"metrics.json differs in {', '.join(result['metrics_json_differs'])}")
    verdict = "identical to the original" if result["identical"] else "not identical"
    lines.append(f"rerun of {result['original']} in {result['rerun']}: {verdict}")
    return lines
