"""memloop.core: errors' exit path, the one path rule, atomic writes, hashes, safe names, tables."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from memloop.core import (
    UserError,
    atomic_write_json,
    atomic_write_text,
    atomic_writer,
    exit_on_user_error,
    file_sha256,
    format_table,
    json_sha256,
    load_yaml_model,
    safe_name,
)


def test_user_error_is_one_line_and_exit_2():
    err = io.StringIO()

    def fails():
        raise UserError("run.yaml: key 'cycles': must be at least 1\n(check the file)")

    assert exit_on_user_error(fails, stream=err) == 2
    assert (
        err.getvalue()
        == "memloop: error: run.yaml: key 'cycles': must be at least 1 (check the file)\n"
    )
    assert exit_on_user_error(lambda: None, stream=err) == 0
    assert exit_on_user_error(lambda: 3, stream=err) == 3
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        exit_on_user_error(lambda: 1 // 0, stream=err)


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    cycles: int = 1
    endpoints: dict[str, str] = {}


def test_paths_inside_a_yaml_are_relative_to_its_folder(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    path = folder / "run.yaml"
    # (names memloop does not ship: a shipped one is found when nothing is beside the file)
    path.write_text("policy: ../policies/mine.yaml\nendpoints: {agent: mine.yaml}\n")
    config = load_yaml_model(Experiment, path, path_keys=("policy", "endpoints.agent"))
    assert config.policy == str(tmp_path / "policies" / "mine.yaml")
    assert config.endpoints == {"agent": str(folder / "mine.yaml")}
    absolute = load_yaml_model(
        Experiment, path, path_keys=("policy",), data={"policy": "/abs/p.yaml"}
    )
    assert absolute.policy == "/abs/p.yaml"
    overridden = load_yaml_model(
        Experiment, path, path_keys=("policy",), overrides={"cycles": 4, "policy": None}
    )
    assert overridden.cycles == 4 and overridden.policy == str(tmp_path / "policies" / "mine.yaml")


def test_a_copied_shipped_yaml_keeps_naming_the_shipped_files(tmp_path):
    """The quickstart's YAML copied elsewhere: its `policy:` is found among the shipped files;
    a file beside the copy wins over the shipped one; a path in neither place stays beside."""
    from memloop.core.settings import SHIPPED_FILES
    from memloop.optimize.config import EvolveConfig, load_config

    copy = tmp_path / "mine.yaml"
    copy.write_text((SHIPPED_FILES / "quickstart.yaml").read_text())
    config = load_config(copy, EvolveConfig)
    assert config.policy == str(SHIPPED_FILES / "policies" / "awi-quickstart.yaml")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "awi-quickstart.yaml").write_text("type: awi\n")
    assert load_config(copy, EvolveConfig).policy == str(
        tmp_path / "policies" / "awi-quickstart.yaml"
    )
    path = tmp_path / "run.yaml"
    path.write_text("policy: policies/none-such.yaml\n")
    config = load_yaml_model(Experiment, path, path_keys=("policy",))
    assert config.policy == str(tmp_path / "policies" / "none-such.yaml")


@pytest.mark.parametrize("shipped", ["tune/awe-small.yaml", "tune/awe.yaml"])
def test_a_copied_shipped_yaml_finds_what_it_names_from_its_own_folder(tmp_path, shipped):
    """Issue 59: the shipped tune files name `../policies/awe.yaml` and `../endpoints/...` (from
    their own folder); a copy anywhere else finds the same shipped files, not a missing one."""
    from memloop.core.settings import SHIPPED_FILES
    from memloop.optimize.config import TuneConfig, load_config

    original = load_config(SHIPPED_FILES / shipped, TuneConfig)
    copy = tmp_path / "deep" / "mine.yaml"
    copy.parent.mkdir()
    copy.write_text((SHIPPED_FILES / shipped).read_text())
    config = load_config(copy, TuneConfig)
    assert config.policy == original.policy == str(SHIPPED_FILES / "policies" / "awe.yaml")
    assert config.endpoints == original.endpoints
    named = [ref for ref in config.endpoints.model_dump().values() if ref]
    assert all(Path(ref).is_relative_to(SHIPPED_FILES / "endpoints") for ref in named)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "policy: a\ncolour: red\n",
            "run.yaml: unknown key 'colour' (allowed: policy, cycles, endpoints)",
        ),
        ("policy: a\ncycles: many\n", "run.yaml: key 'cycles': Input should be a valid integer"),
        ("- a\n- b\n", "run.yaml: expected a mapping of keys to values at the top level"),
        ("policy: [unclosed\n", "run.yaml: not valid YAML"),
    ],
)
def test_bad_yaml_names_file_and_key(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_yaml_model(Experiment, path)
    assert str(info.value).startswith(str(tmp_path / message.split(": ", 1)[0]))
    assert message.split(": ", 1)[1].split(" (")[0] in str(info.value)


def test_impossible_dates_stay_text(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("policy: 2020-13-01\n")
    assert load_yaml_model(Experiment, path).policy == "2020-13-01"


def test_atomic_writes_replace_whole_files_and_leave_no_temp(tmp_path):
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"b": 1, "a": "é"})
    assert target.read_text(encoding="utf-8") == '{\n "b": 1,\n "a": "é"\n}\n'
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write("half")
        raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text(encoding="utf-8")) == {"b": 1, "a": "é"}  # old file intact
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and oct(target.stat().st_mode & 0o777) == "0o644"


def no_space(*args):
    """What a write or an fsync on a full disk raises: no file named."""
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_under_an_atomic_write_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """Issue 57: a full disk under --out was a 31-line traceback (the OSError named no file)."""
    target = tmp_path / "out" / "metrics.json"
    target.parent.mkdir()
    monkeypatch.setattr("memloop.core.files.os.fsync", no_space)
    err = io.StringIO()
    assert exit_on_user_error(lambda: atomic_write_text(target, "{}"), stream=err) == 2
    assert err.getvalue() == (
        f"memloop: error: {target}: No space left on device (the disk is full: free space or "
        "choose another folder)\n"
    )
    assert list(target.parent.iterdir()) == []  # no temporary file left


def test_a_full_disk_that_names_no_file_is_still_one_line():
    err = io.StringIO()
    assert exit_on_user_error(lambda: no_space(), stream=err) == 2
    assert err.getvalue() == (
        "memloop: error: writing: No space left on device (the disk is full: free space or "
        "choose another folder)\n"
    )


def test_hashes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc" * 1000)
    assert file_sha256(path, chunk=7) == hashlib.sha256(b"abc" * 1000).hexdigest()
    expected = hashlib.sha256(b'{"a":[1,"\xc3\xa9"],"b":1}').hexdigest()
    assert json_sha256({"b": 1, "a": [1, "é"]}) == expected  # sorted keys, compact, UTF-8


def test_safe_names_keep_safe_text_and_never_collide():
    assert safe_name("user-01_a.b") == "user-01_a.b"
    names = {safe_name(t) for t in ("alice/1", "alice_1", "alice:1", "..", ".", "")}
    assert len(names) == 6
    assert safe_name("alice/1").startswith("alice_1-") and len(safe_name("alice/1")) == 16
    assert all("/" not in n and n not in (".", "..", "") for n in names)
    # a long id (issue 29: a 300-character user id) gets a bounded name, distinct per id
    long_a, long_b = "u" * 300, "u" * 299 + "v"
    assert safe_name("u" * 100) == "u" * 100
    assert len(safe_name(long_a)) == 80 + 1 + 8 and safe_name(long_a) != safe_name(long_b)


def test_format_table_aligns_columns():
    table = format_table(["mode", "score", "n"], [["none", 0.5, 3], ["complete", None, 12]])
    assert table.splitlines() == [
        "mode      score   n",
        "none      0.500   3",
        "complete    n/a  12",
    ]
    with pytest.raises(ValueError, match="row 0 has 2 cells, expected 3"):
        format_table(["a", "b", "c"], [[1, 2]])


def test_the_program_sets_its_gc_thresholds_and_an_import_does_not():
    import gc
    import subprocess
    import sys

    from memloop.core.settings import PROGRAM_GC_THRESHOLDS, program_gc

    probe = (
        "import gc, memloop.experiments.cli, memloop.feedback.evaluate; print(gc.get_threshold())"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(700, 10, 10)"  # a library user keeps Python's defaults
    before = gc.get_threshold()
    try:
        program_gc()
        assert gc.get_threshold() == PROGRAM_GC_THRESHOLDS == (50_000, 20, 100)
    finally:
        gc.set_threshold(*before)


def test_a_check_report_groups_its_outcomes_by_the_section_they_ran_in():
    from memloop.core.checks import CheckReport

    report = CheckReport(name="p")
    report.section = "members"
    report.expect(True, "has a name", "no name")
    report.expect(False, "has a view", "no view")
    report.section = "close"
    report.expect(True, "closes twice", "raised")
    assert report.grouped() == [
        ("members", [("has a name", None), ("has a view", "no view")]),
        ("close", [("closes twice", None)]),
    ]
    assert report.problems == ["no view"] and report.checks == [
        "has a name",
        "has a view",
        "closes twice",
    ]


def test_a_long_lock_wait_is_said_once_naming_the_holder(tmp_path, monkeypatch, capsys):
    """Issue 57: a hung lock holder made later commands wait without a word."""
    import os
    import subprocess
    import sys
    import textwrap
    import time

    from memloop.core import files

    lock = tmp_path / "store.db.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, time
                from memloop.core.files import file_lock
                with file_lock({str(lock)!r}):
                    print("held", flush=True)
                    time.sleep(1.5)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(files, "LOCK_NOTICE_S", 0.2)
        started = time.monotonic()
        with files.file_lock(lock, "the MLflow store's lock"):
            waited = time.monotonic() - started
            mine = lock.read_text()
    finally:
        holder.wait(timeout=30)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"memloop: waiting for the MLflow store's lock ({lock}), held by process "
        f"{holder.pid} (-c); Ctrl-C stops"
    ]
    assert waited > 0.2  # it did wait for the holder, then took the lock
    assert mine.startswith(f"process {os.getpid()} ")  # and says so to the next one


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    """Issue 57: a kill -9 while a figure was written left a 0-byte `.svg.tmp` for good."""
    import os
    import signal
    import subprocess
    import sys

    target = tmp_path / "cycles.svg"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from memloop.core.files import atomic_writer\n"
            f"with atomic_writer({str(target)!r}, 'wb'):\n"
            "    print('writing', flush=True)\n"
            "    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline() == "writing\n"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(f".cycles.svg.{writer.pid}.") and left.stat().st_size == 0
    alive = tmp_path / f".cycles.svg.{os.getpid()}.abcdefgh.tmp"  # a live writer's: kept
    alive.write_bytes(b"")
    atomic_write_text(target, "<svg/>")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "cycles.svg"])


def test_prose_is_wrapped_between_words_never_inside_a_path():
    from memloop.core.tables import wrap_prose

    plot = "runs/tune/awe-hyperparameters-small-with-a-long-name/parameter-importance-history.png"
    text = f"Optuna's plots: {plot}, {plot.replace('history', 'slice')}, and one more word"
    wrapped = wrap_prose(text, width=60)
    lines = wrapped.splitlines()
    assert lines == [
        "Optuna's plots:",
        f"  {plot},",
        f"  {plot.replace('history', 'slice')},",
        "  and one more word",
    ]
    # a line's own indent is kept, and later lines go two further in
    assert wrap_prose("  a b c d", width=6).splitlines() == ["  a b", "    c", "    d"]
