"""Progress while a run works: bars named by condition, cycle and split with the model calls so
far, and a line while the embedded model starts; nothing of it under --no-progress."""

from __future__ import annotations

import re
import time

import pytest

from memloop.environment.episode import EpisodeProgress
from memloop.environment.procedural import generate_procedural
from memloop.llm.usage import UsageTracker
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import small_evolve


@pytest.fixture
def terminal(monkeypatch):
    """stderr taken for a terminal: bars are drawn (captured, it is a file)."""
    monkeypatch.setattr("memloop.environment.episode.on_terminal", lambda: True)


def test_an_evolve_s_bars_name_condition_cycle_split_and_calls(tmp_path, capsys, terminal):
    from memloop.optimize.evolve import run_evolve

    config = small_evolve(
        tmp_path, "bars", (1, 1, 1), periods=1, questions=1, evolvers=["playbook"], cycles=1
    )
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        run_evolve(config, progress=True, clients=roles, builder=scripted_builder())
        sent = len(fake.requests)
    err = capsys.readouterr().err
    for split in ("train", "val", "test"):
        assert f"complete/playbook cycle 0 · {split} users" in err
    assert "complete/playbook cycle 0 · periods" in err
    # the final count: the requests of the episodes (not the calibration's nor the evolver's)
    counts = [int(n) for n in re.findall(r"calls=(\d+)", err)]
    assert counts and 0 < max(counts) < sent
    # --no-progress: nothing drawn
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c2.sqlite")
        config.out_dir = str(tmp_path / "quiet")
        config.tracking_uri = f"sqlite:///{tmp_path}/quiet.db"
        run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    assert capsys.readouterr().err == ""


def test_the_calls_are_shown_while_a_period_runs_from_a_timer(monkeypatch, capsys, terminal):
    monkeypatch.setattr(EpisodeProgress, "TICK_S", 0.02)
    items = generate_procedural(users=2, periods=1, questions=1, seed=0)
    bars = EpisodeProgress(
        items, 4, enabled=True, label="eval awi", groups={items[0].id: "val", items[1].id: "test"}
    )
    usage = UsageTracker()
    bars.started(usage)
    for cached in (False, False, True):
        usage.record("agent", prompt_tokens=3, completion_tokens=2, cached=cached)
    deadline = time.monotonic() + 5
    while "calls=2" not in str(bars.periods.postfix) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bars.periods.postfix == "calls=2 cached=1"  # no period finished yet
    bars.stopped(usage)
    bars.user_done(items[0].id)
    bars.close()
    assert bars._timer is not None and not bars._timer.is_alive()
    err = capsys.readouterr().err
    assert "eval awi · val users" in err and "eval awi · test users" in err
    assert "eval awi · periods" in err and "calls=2 cached=1" in err


def test_not_on_a_terminal_each_finished_user_is_one_plain_line(tmp_path, capsys):
    """A log file or a pipe: no bar fragments, a line per finished user with the time left."""
    from memloop.optimize.evolve import run_evolve

    config = small_evolve(
        tmp_path, "lines", (1, 1, 2), periods=2, questions=1, evolvers=["playbook"], cycles=1
    )
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        run_evolve(config, progress=True, clients=roles, builder=scripted_builder())
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err  # no bar redrawn, no cursor moves
    lines = [line for line in err.splitlines() if "cycle 0 · " in line]
    # the cycle's evaluation: 4 users of 3 periods each (period 0 and 2 updates), in splits
    shape = re.compile(
        r"complete/playbook cycle 0 · (train|val|test) users: (\d)/(\d) done · "
        r"periods (\d+)/12 · \d+ s elapsed(, ~\d+ s left)? · calls=\d+( cached=\d+)?"
    )
    matched = [shape.fullmatch(line) for line in lines]
    assert len(lines) == 4 and all(matched), lines
    done = [int(m.group(4)) for m in matched if m]
    assert done == sorted(done) and done[-1] == 12
    assert ", ~" not in lines[-1] and all(", ~" in line for line in lines[:-1])
    assert {(m.group(1), m.group(3)) for m in matched if m} == {
        ("train", "1"),
        ("val", "1"),
        ("test", "2"),
    }


def test_a_duration_reads_in_seconds_minutes_or_hours():
    from memloop.environment.episode import _duration

    assert [_duration(s) for s in (0.4, 59.6, 65, 3599, 3725)] == [
        "0 s",
        "1 min 00 s",
        "1 min 05 s",
        "59 min 59 s",
        "1 h 02 min",
    ]


def test_disabled_bars_draw_nothing_and_start_no_thread(capsys):
    items = generate_procedural(users=1, periods=1, questions=1, seed=0)
    bars = EpisodeProgress(items, 2, enabled=False, label="x")
    usage = UsageTracker()
    bars.started(usage)
    bars.period_done()
    bars.stopped(usage)
    bars.user_done(items[0].id)
    bars.close()
    assert bars._timer is None and capsys.readouterr().err == ""


class Stop(Exception):
    pass


@pytest.mark.parametrize("notice", [True, False])
def test_a_line_says_the_embedded_model_is_starting(tmp_path, monkeypatch, capsys, notice):
    from memloop.llm import embedded_server
    from memloop.llm.model_files import QWEN_0_5B

    # no running server of the machine to attach to: this process starts one
    monkeypatch.setattr(embedded_server.runtime, "runtime_dir", lambda: tmp_path)

    def stop_here(model):  # the line comes before the model file is verified and loaded
        raise Stop

    monkeypatch.setattr(embedded_server, "ensure_model_file", stop_here)
    monkeypatch.setattr(embedded_server, "START_NOTICE", notice)
    with pytest.raises(Stop):
        embedded_server.EmbeddedServer(QWEN_0_5B).start()
    err = capsys.readouterr().err
    line = f"starting the embedded model {QWEN_0_5B.display_name} (takes ~3 s)...\n"
    assert err == (line if notice else "")


def test_no_progress_also_silences_the_start_line(tmp_path, monkeypatch):
    from memloop.experiments.cli import main
    from memloop.llm import embedded_server

    monkeypatch.setattr(embedded_server, "START_NOTICE", True)
    argv = ["eval", "--env", str(tmp_path / "none.json"), "--policy", "p.yaml", "--out", "o"]
    assert main([*argv, "--no-progress"]) == 2  # refused (no such file), after parsing
    assert embedded_server.START_NOTICE is False
    assert main(argv) == 2
    assert embedded_server.START_NOTICE is True
