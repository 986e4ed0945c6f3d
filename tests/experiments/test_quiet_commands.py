"""Issue 44: no third-party warning or traceback in a command's normal output.

Read from the commands themselves: `memloop tune` and `memloop evolve` run as a user runs them (a
process of their own, the fake endpoint for every role, a new memloop cache folder so that
MLflow's schema is made by its own migrations, a new Optuna store), and their stderr is read.
The cases issue 44 found: matplotlib's tight_layout warnings on tune's figures (three options:
a slice panel each), Optuna's failed-trial warning with its traceback before memloop's one line,
and SQLAlchemy's deprecation warnings from the stores' schema migrations (the stores are made
here; Python shows no DeprecationWarning outside __main__ unless asked to, so none appears).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memloop.testing import FakeOpenAIServer, evolve_loop_reply
from memloop.testing.commands import write_small_evolve, write_small_tune


def memloop(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MEMLOOP_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "memloop", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )


def endpoints(tmp_path: Path, fake: FakeOpenAIServer) -> dict[str, str]:
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\nmax_retries: 0\n")
    return {role: str(endpoint) for role in ("agent", "user_sim", "checker", "optimizer")}


def write_tune(tmp_path: Path, fake: FakeOpenAIServer) -> Path:
    return write_small_tune(
        tmp_path,
        "quiet",
        trials=2,
        # three options: Optuna's slice plot has a panel each (tight_layout warned on such)
        search_space={
            "update_freq": [2, 4],
            "short_term_len": [0, 4],
            "reply_max_tokens": [32, 64],
        },
        endpoints=endpoints(tmp_path, fake),
        parallel_users=1,
    )


def test_an_awe_tune_prints_no_library_warning(tmp_path):
    """Issue 59: mem0's import turned every DeprecationWarning on, process-wide, and SQLAlchemy's
    deprecation warning from MLflow's schema migration was printed by every AWE tune. Two trials
    over three options: Optuna's slice plot has a panel each (tight_layout warned on such)."""
    (tmp_path / "awe.yaml").write_text("type: awe\n")
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        path = write_tune(tmp_path, fake)
        path.write_text(path.read_text().replace(str(tmp_path / "awi.yaml"), "awe.yaml"))
        # the objective from the command line (its hint's advice, no YAML edit)
        done = memloop(
            tmp_path, "tune", str(path), "--no-progress", "--objective", "state_accuracy"
        )
    assert done.returncode == 0, done.stderr
    assert "2 finished trials" in done.stdout
    assert "state_acc (objective)" in done.stdout and "mem_score (objective)" not in done.stdout
    assert done.stderr == ""
    # its stores were made here, by the migrations whose warnings are kept out
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    assert (tmp_path / "mlruns" / "optuna.db").is_file()
    assert list((tmp_path / "cache" / "mlflow-schema").glob("*.db"))


def test_a_failing_trial_is_memloops_one_line_without_optunas_traceback(tmp_path):
    with FakeOpenAIServer(reply=evolve_loop_reply, failures=[404] * 100) as fake:
        done = memloop(tmp_path, "tune", str(write_tune(tmp_path, fake)), "--no-progress")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memloop: error: "), done.stderr
    assert "Traceback" not in done.stderr and "failed with parameters" not in done.stderr


def test_loading_a_mem0_export_as_the_docs_say_prints_nothing(tmp_path):
    """Issue 59: a mem0 export loaded by `mem0.Memory.from_config` as docs/experiments.md says:
    MEM0_TELEMETRY=False (offline, mem0's telemetry otherwise prints an error per event) and
    HF_HUB_DISABLE_PROGRESS_BARS=1 (transformers' "Loading weights" bar for the embedder)."""
    from memloop.results.export import write_export
    from memloop.testing.exports import made_export

    write_export(made_export("awe"), "mem0", tmp_path / "mem0_config.json")
    script = (
        "import json, os; os.environ['MEM0_TELEMETRY'] = 'False'; "
        "os.environ['HF_HUB_DISABLE_PROGRESS_BARS'] = '1'; "
        "from mem0 import Memory; "
        "memory = Memory.from_config(json.load(open('mem0_config.json'))); "
        "print(type(memory).__name__)"
    )
    env = {**os.environ, "MEM0_DIR": str(tmp_path / "mem0-home")}
    env.pop("PYTHONWARNINGS", None)
    for name in ("MEM0_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)  # set by the script, as a user does
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Memory\n" and done.stderr == ""


def test_an_awe_evolve_and_its_dspy_export_print_no_library_warning(tmp_path):
    """Issue 59: the AWE evolve path (mem0 imported, MLflow's store migrated, two cycles of the
    reflective evolver) prints nothing on stderr, nor does its DSPy export (DSPy warns on saving
    a whole program with pickles)."""
    (tmp_path / "awe.yaml").write_text("type: awe\n")
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        path = write_small_evolve(
            tmp_path,
            "quiet-awe",
            (1, 1, 1),
            periods=1,
            questions=1,
            cycles=2,
            policy=str(tmp_path / "awe.yaml"),
            endpoints=endpoints(tmp_path, fake),
        )
        done = memloop(tmp_path, "evolve", str(path), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "awe" in done.stdout and done.stderr == ""
    (run_dir,) = (tmp_path / "runs").iterdir()
    out = tmp_path / "program.json"
    exported = memloop(tmp_path, "export", str(run_dir), "--format", "dspy", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == "" and out.is_file()
    assert exported.stdout.count("\n") == 1  # its one line: what was written


def test_importing_mem0_through_memloop_leaves_the_warning_filters_as_they_were():
    import subprocess as sp

    script = (
        "import warnings; before = list(warnings.filters); "
        "import memloop.policies.external; "
        "import mem0.client.main; "  # the module whose import turned them on
        "assert warnings.filters == before, warnings.filters[:3]"
    )
    done = sp.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
