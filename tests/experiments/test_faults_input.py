"""Input memloop did not choose, met at the command line (issue 45): a plug-in whose method raises
or whose prompts() is no dict of texts; Ctrl-C in `import-amemgym` and `export`; an --out file
memloop did not write; control characters in names printed to the terminal.

Each ends in one line: exit 2 with ``memloop: error: ...``, or 130 on Ctrl-C; never a traceback,
never a file replaced that memloop did not write, never a raw escape sequence on the terminal."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memloop.core import interrupt
from memloop.core.tables import format_table
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, schema_valid_reply
from memloop.testing.commands import eval_argv, small_evolve
from memloop.testing.paths import REPO, TEST_DATA

DATA = TEST_DATA
EVIL = "evil\u202elive\x1b[31mred"  # a right-to-left override and an ANSI colour
EVIL_SHOWN = "evil\\u202elive\\x1b[31mred"


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("memloop")]


@pytest.fixture(autouse=True)
def stop_flag_cleared():
    """A test that presses Ctrl-C leaves the process-wide stop flag as it found it, and starts
    with Python's own SIGINT handler, as a memloop process does (a library loaded by an earlier
    test of the session may have left its own handler in place)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    interrupt.clear()
    signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- plug-ins that raise


DIARY = """
import json
from pathlib import Path

from memloop.policies import Answer
from memloop.testing.paths import REPO, TEST_DATA


class Diary:
    name = {name!r}

    def __init__(self, options, client, workdir):
        self.client, self.lines, self.rules = client, [], {{"diary": "Write everything down."}}

    def respond(self, user_message):
        self.lines.append(user_message)
        return "Noted."

    def ingest(self, user_message, assistant_message):
        self.lines.append(user_message)

    def answer(self, prompt, *, schema=None, memory_only=False):
        messages = [{{"role": "system", "content": "\\n".join(self.lines)}},
                    {{"role": "user", "content": prompt}}]
        if schema is None:
            return Answer(self.client.chat(messages, component="probe").text, list(self.lines))
        r = self.client.chat_json(messages, schema, component="probe")
        return Answer(r.text, list(self.lines), r.parsed, r.json_error)

    def memory_view(self):
        return "\\n".join(self.lines)

    def unwritten_messages(self):
        return 0

    def prompts(self):
        return dict(self.rules)

    def with_prompts(self, prompts, *, keep_memory=False):
        twin = Diary({{}}, self.client, None)
        twin.lines = list(self.lines) if keep_memory else []
        twin.rules = {{**self.rules, **prompts}}
        return twin

    def save(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "diary.json").write_text(json.dumps([self.lines, self.rules]))

    def load(self, directory):
        self.lines, self.rules = json.loads((Path(directory) / "diary.json").read_text())
        return self

    def close(self):
        pass


class Broken(Diary):
    def {method}(self, *args, **kwargs):
        {body}
"""
BOOM = 'raise RuntimeError("boom")'


def plugin(tmp_path: Path, method: str, body: str = BOOM, name: str = "diary") -> tuple[Path, int]:
    """A policy YAML naming `Broken`, whose `method` runs `body`; and the line of `body`."""
    source = DIARY.format(name=name, method=method, body=body)
    (tmp_path / "broken.py").write_text(source)
    (tmp_path / "broken.yaml").write_text("type: broken.py:Broken\n")
    line = source.splitlines().index(f"        {body}") + 1
    return tmp_path / "broken.yaml", line


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(reply=schema_valid_reply) as server:
        yield server


def run_eval(tmp_path: Path, policy: Path, fake: FakeOpenAIServer, items=None) -> int:
    items = items or generate_procedural(users=2, periods=1, questions=1, seed=5)
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(items, env)
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
    argv = eval_argv(env, policy, endpoint, tmp_path / "c.sqlite", tmp_path / "run")
    return main([*argv, "--parallel-users", "1", "--no-progress"])


@pytest.mark.parametrize(
    ("method", "where"),
    [
        ("respond", "for user {user}, period 0"),  # a session's turn
        ("save", "for user {user}, period 0"),  # the period's checkpoint
        ("answer", "for user {user}, period 0"),  # a probe
        ("memory_view", "for user {user}, period 0"),  # the recall check of a probe
        ("unwritten_messages", "for user {user}, period 0"),
        ("prompts", ""),  # read once before any user: part of the run's identity
        ("close", ""),  # the policy built to read its prompts is closed first
    ],
)
def test_a_plugin_method_that_raises_is_one_line_naming_it(tmp_path, capsys, fake, method, where):
    policy, line = plugin(tmp_path, method)
    items = generate_procedural(users=2, periods=1, questions=1, seed=5)
    assert run_eval(tmp_path, policy, fake, items) == 2
    err = capsys.readouterr().err
    at = where.format(user=items[0].id)
    expected = f"plug-in diary.{method} raised RuntimeError('boom')"
    expected += f" {at}" if at else ""
    expected += f" (in {method}, at broken.py:{line})"
    assert error_lines(err) == [f"memloop: error: {expected}"], err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_plugin_load_that_raises_on_resume_names_the_checkpoint_period(tmp_path, capsys, fake):
    policy, line = plugin(tmp_path, "load")
    items = generate_procedural(users=2, periods=1, questions=1, seed=5)
    assert run_eval(tmp_path, policy, fake, items) == 0  # a fresh run never loads
    user_dir = next(p for p in (tmp_path / "run" / "episodes").iterdir() if p.name == items[0].id)
    (user_dir / "period_01" / "record.json").unlink()  # as if killed during period 1
    capsys.readouterr()
    assert run_eval(tmp_path, policy, fake, items) == 2  # resumes: loads period 0's state
    err = capsys.readouterr().err
    assert error_lines(err) == [
        f"memloop: error: plug-in diary.load raised RuntimeError('boom') for user {items[0].id}, "
        f"period 0 (in load, at broken.py:{line}); delete period_00 and the later period "
        "folders beside it to redo from there, or start over (memloop eval --force)"
    ]


def test_a_plugin_ingest_that_raises_on_replay_is_one_line(tmp_path, capsys, fake):
    policy, line = plugin(tmp_path, "ingest")  # Diary.respond keeps its notes without ingest
    items = generate_procedural(users=2, periods=1, questions=1, seed=5)
    assert run_eval(tmp_path, policy, fake, items) == 0
    argv = eval_argv(
        tmp_path / "env.json", policy, tmp_path / "fake.yaml", tmp_path / "c.sqlite", tmp_path / "r"
    )
    capsys.readouterr()
    code = main([*argv, "--replay", str(tmp_path / "run"), "--parallel-users", "1"])
    assert code == 2
    assert error_lines(capsys.readouterr().err) == [
        f"memloop: error: plug-in diary.ingest raised RuntimeError('boom') for user {items[0].id}, "
        f"period 0 (in ingest, at broken.py:{line})"
    ]


def test_an_ingest_that_raises_inside_respond_is_named(tmp_path, capsys, fake):
    """Issue 57: a plug-in whose respond calls its own ingest was reported as respond alone."""
    source = DIARY.format(name="diary", method="save", body="super().save(*args, **kwargs)")
    source += """

class Relaying(Broken):
    def respond(self, user_message):
        self.ingest(user_message, "Noted.")
        return "Noted."

    def ingest(self, user_message, assistant_message):
        raise RuntimeError("boom")
"""
    (tmp_path / "broken.py").write_text(source)
    policy = tmp_path / "relaying.yaml"
    policy.write_text("type: broken.py:Relaying\n")
    line = source.splitlines().index('        raise RuntimeError("boom")') + 1
    items = generate_procedural(users=1, periods=1, questions=1, seed=5)
    assert run_eval(tmp_path, policy, fake, items) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"memloop: error: plug-in diary.respond raised RuntimeError('boom') for user "
        f"{items[0].id}, period 0 (in ingest, at broken.py:{line})"
    ]


def test_a_plugin_with_prompts_that_raises_in_evolve_is_one_line(tmp_path, capsys):
    policy, line = plugin(tmp_path, "with_prompts")  # evolve sets each cycle's prompts with it
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        endpoint = tmp_path / "fake.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {server.base_url}\n")
        roles = ("agent", "user_sim", "checker", "optimizer")
        small_evolve(
            tmp_path,
            "plug-in",
            (1, 1, 1),
            periods=1,
            questions=1,
            cycles=1,
            policy=str(policy),
            endpoints=dict.fromkeys(roles, str(endpoint)),
        )
        assert main(["evolve", str(tmp_path / "exp.yaml"), "--no-progress"]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"memloop: error: plug-in diary.with_prompts raised RuntimeError('boom') "
        f"(in with_prompts, at broken.py:{line})"
    ]


@pytest.mark.parametrize(
    ("body", "returned"),
    [
        ("return ['Write everything down.']", "returned list"),
        ("return None", "returned None"),
        ("return {'diary': 3}", "returned a dict with 'diary': int"),
        ("return {1: 'Write everything down.'}", "returned a dict with 1: str"),
    ],
)
def test_prompts_of_the_wrong_type_are_refused_in_one_line(tmp_path, capsys, fake, body, returned):
    policy, _ = plugin(tmp_path, "prompts", body)
    assert run_eval(tmp_path, policy, fake) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == [
        f"memloop: error: plug-in diary.prompts {returned}, not a dict of prompt name (str) to "
        "prompt text (str): run memloop policy check"
    ], err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- Ctrl-C


def swallow_one_ctrl_c(calls: list[int]):
    """Press Ctrl-C (memloop's own SIGINT handler runs) and lose its KeyboardInterrupt on the way,
    as one raised inside a __del__ or a library's catch-all is lost; then go on."""
    calls.append(1)
    if len(calls) == 1:
        with contextlib.suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_in_import_amemgym_stops_at_the_next_user(tmp_path, capsys, monkeypatch):
    from memloop.feedback import import_amemgym

    calls: list[int] = []
    read_user = import_amemgym._read_user

    def reading(*args, **kwargs):
        swallow_one_ctrl_c(calls)
        return read_user(*args, **kwargs)

    monkeypatch.setattr(import_amemgym, "_read_user", reading)
    out = tmp_path / "imported"
    argv = ["import-amemgym", str(DATA / "amemgym_run"), "--out", str(out)]
    assert main(argv) == 130
    assert calls == [1]  # the second of the two users was never read
    assert error_lines(capsys.readouterr().err) == [
        "memloop: interrupted (finished work is checkpointed: rerun to resume)"
    ]
    assert not out.exists()


STARTING = """
import sys, time
from memloop.experiments import cli

build = cli.build_parser


def starting():  # a command's first second goes into importing its modules
    print("starting", flush=True)
    time.sleep(10)
    return build()


cli.build_parser = starting
sys.exit(cli.main(sys.argv[1:]))
"""


def ctrl_c_while_starting(argv: list[str]) -> tuple[int, float, str]:
    """(exit code, seconds from Ctrl-C to exit, stderr) of a command pressed Ctrl-C at start."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTING, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a child of a background job would inherit an ignored SIGINT; restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "starting\n"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, time.monotonic() - sent, err
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_while_import_amemgym_starts_is_130_without_traceback(tmp_path):
    out = tmp_path / "imported"
    code, took, err = ctrl_c_while_starting(
        ["import-amemgym", str(DATA / "amemgym_run"), "--out", str(out)]
    )
    assert (code, error_lines(err)) == (
        130,
        ["memloop: interrupted (finished work is checkpointed: rerun to resume)"],
    ), err
    assert "Traceback" not in err and took < 2.0
    assert not out.exists()


# ---------------------------------------------------------------- an evolve run named EVIL


@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    """`memloop evolve` of a tiny AWI experiment named EVIL on the fake model: (root, out, err)."""
    root = tmp_path_factory.mktemp("evil")
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        endpoint = root / "fake.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {server.base_url}\n")
        roles = ("agent", "user_sim", "checker", "optimizer")
        small_evolve(
            root,
            f"{EVIL}\nline",
            (1, 1, 1),
            periods=1,
            questions=1,
            cycles=1,
            endpoints=dict.fromkeys(roles, str(endpoint)),
        )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["evolve", str(root / "exp.yaml"), "--no-progress"])
    assert code == 0, err.getvalue()
    return root, out.getvalue(), err.getvalue()


def run_folder(root: Path) -> Path:
    (folder,) = (root / "runs").iterdir()
    return folder


def test_evolve_prints_an_experiment_name_with_its_control_characters_escaped(evolved):
    _, out, err = evolved
    shown = f"{EVIL_SHOWN}\\nline"
    # the notes before the condition's header: cannot-decide, then the JSON read's reason
    decide, read, rest = out.split("\n", 2)
    assert read.startswith("state reads use the JSON read (0/1 scores, no state_prob): ")
    assert decide.startswith("this experiment cannot decide: ")
    assert rest.startswith(f"== {shown}: feedback=complete evolver=reflective search=episode\n")
    assert f"\nexperiment {shown} (MLflow:" in out  # then the store, maybe on the next line
    assert f"\n  memloop compare --experiment {shown} --tracking-uri sqlite:///" in out
    for raw in ("\u202e", "\x1b"):
        assert raw not in out and raw not in err  # the figure's title too (a glyph warning)


def test_ctrl_c_in_export_stops_before_writing(evolved, tmp_path, capsys, monkeypatch):
    from memloop.runs.store import CycleStore

    calls: list[int] = []
    record = CycleStore.record

    def reading(self, cycle):
        swallow_one_ctrl_c(calls)
        return record(self, cycle)

    monkeypatch.setattr(CycleStore, "record", reading)
    out = tmp_path / "prompts.txt"
    assert main(["export", str(run_folder(evolved[0])), "--out", str(out)]) == 130
    assert calls == [1]
    assert error_lines(capsys.readouterr().err) == [
        "memloop: interrupted (finished work is checkpointed: rerun to resume)"
    ]
    assert not out.exists()


def test_ctrl_c_while_export_starts_is_130_without_traceback(evolved, tmp_path):
    out = tmp_path / "prompts.txt"
    code, took, err = ctrl_c_while_starting(
        ["export", str(run_folder(evolved[0])), "--out", str(out)]
    )
    assert (code, error_lines(err)) == (
        130,
        ["memloop: interrupted (finished work is checkpointed: rerun to resume)"],
    ), err
    assert "Traceback" not in err and took < 2.0
    assert not out.exists()


# ---------------------------------------------------------------- --out


def refused(option: str, path: Path, mark: str) -> str:
    return (
        f"memloop: error: {option} {path}: is a file memloop did not write, or one changed since "
        f"({mark}); choose another {option} or remove it yourself"
    )


EXPORT_MARK = "an export records the sha256 of what it wrote"


def test_export_replaces_its_own_export_and_nothing_else(evolved, tmp_path, capsys):
    folder = run_folder(evolved[0])
    out = tmp_path / "prompts.txt"
    assert main(["export", str(folder), "--out", str(out)]) == 0
    first = out.read_text()
    assert main(["export", str(folder), "--out", str(out)]) == 0  # its own: replaced
    assert out.read_text() == first
    capsys.readouterr()
    for text in ("my notes\n", first.replace("=== writer ===\n", "=== writer ===\nMine. ")):
        out.write_text(text)  # the user's file; an export edited since
        assert main(["export", str(folder), "--out", str(out)]) == 2
        assert error_lines(capsys.readouterr().err) == [refused("--out", out, EXPORT_MARK)]
        assert out.read_text() == text


def test_a_dspy_export_does_not_replace_a_source_json_it_did_not_write(evolved, tmp_path, capsys):
    folder = run_folder(evolved[0])
    out = tmp_path / "writer.json"
    source = tmp_path / "writer.source.json"
    source.write_text('{"mine": true}\n')
    assert main(["export", str(folder), "--format", "dspy", "--out", str(out)]) == 2
    assert error_lines(capsys.readouterr().err) == [refused("--out", source, EXPORT_MARK)]
    assert source.read_text() == '{"mine": true}\n' and not out.exists()
    source.unlink()
    for _ in range(2):  # its own program and .source.json: replaced
        assert main(["export", str(folder), "--format", "dspy", "--out", str(out)]) == 0
    assert json.loads(source.read_text())["cycle"] == 0


def test_a_mem0_config_with_the_users_llm_merged_in_is_not_replaced(tmp_path):
    from memloop.core.errors import UserError
    from memloop.results.export import write_export
    from memloop.testing.exports import made_export

    exported = made_export(
        "awe",
        cycle=1,
        rule="--cycle 1",
        val_objective=0.5,
        prompts={"fact_extraction": "Extract facts.", "memory_update": "Update memories."},
        policy_config=None,
    )
    out = tmp_path / "mem0.json"
    write_export(exported, "mem0", out)
    write_export(exported, "mem0", out)  # its own, unchanged: replaced
    config = json.loads(out.read_text())
    config["llm"] = {"provider": "openai", "config": {"model": "gpt-4.1-mini"}}
    out.write_text(json.dumps(config))
    with pytest.raises(UserError) as refusal:
        write_export(exported, "mem0", out)
    assert f"memloop: error: {refusal.value}" == refused("--out", out, EXPORT_MARK)
    assert json.loads(out.read_text())["llm"]["config"]["model"] == "gpt-4.1-mini"


PROCEDURAL = ["env", "procedural", "--users", "1", "--periods", "1", "--questions", "1"]
PROCEDURAL_MARK = (
    "memloop cannot tell a data.json it wrote, and this one is not what these settings generate"
)


def test_env_procedural_never_replaces_another_file(tmp_path, capsys):
    out = tmp_path / "data.json"
    assert main([*PROCEDURAL, "--out", str(out)]) == 0
    first = out.read_bytes()
    assert main([*PROCEDURAL, "--out", str(out)]) == 0  # the same bytes again: nothing lost
    assert out.read_bytes() == first
    capsys.readouterr()
    assert main([*PROCEDURAL, "--seed", "7", "--out", str(out)]) == 2  # another environment
    assert error_lines(capsys.readouterr().err) == [refused("--out", out, PROCEDURAL_MARK)]
    assert out.read_bytes() == first
    out.write_text("my notes\n")
    assert main([*PROCEDURAL, "--out", str(out)]) == 2
    assert error_lines(capsys.readouterr().err) == [refused("--out", out, PROCEDURAL_MARK)]
    assert out.read_text() == "my notes\n"


def test_env_generate_refuses_a_folder_holding_a_data_json_it_did_not_write(tmp_path, capsys):
    config = REPO / "memloop/experiments/env/base.yaml"
    endpoint = tmp_path / "nowhere.yaml"
    endpoint.write_text("model: m\nbase_url: http://127.0.0.1:9/v1\n")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.json").write_text("[]\n")
    argv = ["env", "generate", str(config), "--endpoint", str(endpoint), "--out", str(out)]
    assert main([*argv, "--users", "1", "--no-progress"]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"memloop: error: --out {out}: holds files memloop did not write (data.json, and no "
        "config.json of `memloop env generate`); choose another --out or remove them yourself"
    ]
    assert (out / "data.json").read_text() == "[]\n"


IMPORT_MARK = "an import's metrics.json names the run it came from in 'imported_from'"


def test_import_amemgym_replaces_an_earlier_import_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "imported"
    argv = ["import-amemgym", str(DATA / "amemgym_run"), "--out", str(out)]
    assert main(argv) == 0
    first = (out / "records.jsonl").read_text()
    assert main(argv) == 0  # an earlier import: replaced
    assert (out / "records.jsonl").read_text() == first
    capsys.readouterr()
    (out / "metrics.json").write_text('{"mine": 1}\n')
    assert main(argv) == 2
    assert error_lines(capsys.readouterr().err) == [
        refused("--out", out / "metrics.json", IMPORT_MARK)
    ]
    assert (out / "metrics.json").read_text() == '{"mine": 1}\n'
    (out / "metrics.json").unlink()  # records.jsonl alone: nothing says whose it is
    assert main(argv) == 2
    assert error_lines(capsys.readouterr().err) == [
        refused("--out", out / "records.jsonl", IMPORT_MARK)
    ]
    assert (out / "records.jsonl").read_text() == first


def test_import_amemgym_refuses_a_memloop_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.json").write_text("{}\n")
    assert main(["import-amemgym", str(DATA / "amemgym_run"), "--out", str(run)]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"memloop: error: {run}: holds a memloop run (spec.json): its records.jsonl and "
        "metrics.json are not an import's to replace; choose another --out"
    ]
    assert sorted(p.name for p in run.iterdir()) == ["spec.json"]


# ---------------------------------------------------------------- control characters in names


def test_printable_escapes_control_and_format_characters_only():
    from memloop.core.tables import printable  # the one helper, used at every printing point

    assert printable(EVIL) == EVIL_SHOWN
    assert printable("a\nb\tc\rd\x00") == "a\\nb\\tc\\rd\\x00"
    assert printable("Zoë · 東京 ±1") == "Zoë · 東京 ±1"  # printable text stays as it is
    assert printable(3) == "3"


@pytest.mark.parametrize("fmt", ["table", "csv", "md"])
def test_tables_escape_the_names_in_their_cells(fmt):
    table = format_table(["name", "score"], [[EVIL, 0.5]], fmt=fmt)
    assert EVIL_SHOWN in table
    assert "\u202e" not in table and "\x1b" not in table


def test_eval_escapes_a_policy_name_and_a_user_id_in_its_bars_and_errors(
    tmp_path, capsys, fake, monkeypatch
):
    monkeypatch.setattr("memloop.environment.episode.on_terminal", lambda: True)  # bars
    policy, line = plugin(tmp_path, "respond", name=f"diary-{EVIL}")
    items = generate_procedural(users=1, periods=1, questions=1, seed=5)
    items[0].id = f"user-{EVIL}"
    save_items(items, tmp_path / "env.json")
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
    argv = eval_argv(tmp_path / "env.json", policy, endpoint, tmp_path / "c", tmp_path / "run")
    assert main(argv) == 2  # with its progress bars
    err = capsys.readouterr().err
    assert f"eval diary-{EVIL_SHOWN} · users" in err
    assert error_lines(err) == [
        f"memloop: error: plug-in diary-{EVIL_SHOWN}.respond raised RuntimeError('boom') for "
        f"user user-{EVIL_SHOWN}, period 0 (in respond, at broken.py:{line})"
    ]
    assert "\u202e" not in err and "\x1b[31m" not in err


def test_a_full_disk_under_out_is_one_line_naming_the_file(tmp_path, capsys, fake, monkeypatch):
    """Issue 57: an eval whose --out folder's disk is full ended in a 31-line traceback."""
    import errno

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    save_items(generate_procedural(users=2, periods=1, questions=1, seed=5), tmp_path / "env.json")
    (tmp_path / "native.yaml").write_text("type: native\n")
    monkeypatch.setattr("memloop.core.files.os.fsync", no_space)
    assert run_eval(tmp_path, tmp_path / "native.yaml", fake) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"memloop: error: {tmp_path / 'run'}")
    assert line.endswith(
        ": No space left on device (the disk is full: free space or choose another folder)"
    )
