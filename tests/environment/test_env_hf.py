"""`hf://` environment data and `memloop env pull`, offline, on a Hugging Face cache built on disk.

The cache has huggingface_hub's real layout (refs/main -> commit, snapshots/<commit>/<file>), so
the real hf_hub_download / snapshot_download read it; HF_HUB_OFFLINE=1 keeps them off the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memloop.core.errors import UserError
from memloop.environment.datafile import load_items, save_items
from memloop.environment.hf_data import DEFAULT_FILE, HfRef, parse_ref
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import paths
from memloop.testing.paths import TEST_DATA

SAMPLE = TEST_DATA / "published_sample.json"
REPO = "AGI-Eval/AMemGym"
COMMIT = "4b8f64f0c0ffee0123456789abcdef0123456789"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def offline_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF cache folder (not created) in the environment, with downloads forbidden."""
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


@pytest.fixture
def cached(offline_env: Path, tmp_path: Path) -> dict[str, Path]:
    """The dataset in the cache: the published sample as v1.base, a 3-user file as v1.extra."""
    extra_source = tmp_path / "extra.json"
    save_items(generate_procedural(users=3, periods=2, questions=2), extra_source)
    repo = offline_env / "datasets--AGI-Eval--AMemGym"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    sources = {DEFAULT_FILE: SAMPLE, "v1.extra/data.json": extra_source}
    for name, source in sources.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, snapshot / name)
    (snapshot / "README.md").write_text("# AMemGym\n")
    return sources


def _ids(path: str | Path) -> list[str]:
    return [item.id for item in load_items(path)]


def test_hf_reference_loads_the_cached_default_file(cached: dict[str, Path]) -> None:
    assert _ids(f"hf://{REPO}") == _ids(SAMPLE)
    assert _ids(f"hf://{REPO}@main") == _ids(SAMPLE)
    assert _ids(f"hf://{REPO}@{COMMIT}") == _ids(SAMPLE)
    assert _ids(f"hf://datasets/{REPO}") == _ids(SAMPLE)


def test_hf_reference_names_a_config_or_a_file(cached: dict[str, Path]) -> None:
    extra = _ids(cached["v1.extra/data.json"])
    assert len(extra) == 3
    assert _ids(f"hf://{REPO}/v1.extra") == extra
    assert _ids(f"hf://{REPO}/v1.extra/data.json") == extra
    assert _ids(f"hf://{REPO}@{COMMIT}/v1.base") == _ids(SAMPLE)


def test_env_validate_reads_an_hf_reference(
    cached: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["env", "validate", f"hf://{REPO}"]) == 0
    assert f"hf://{REPO}: valid" in capsys.readouterr().out


def test_pull_prints_every_data_file_with_its_users(
    cached: dict[str, Path], offline_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(offline_env)
    assert main(["env", "pull", REPO]) == 0
    out = capsys.readouterr().out.splitlines()
    snapshot = offline_env / "datasets--AGI-Eval--AMemGym" / "snapshots" / COMMIT
    assert out == [
        f"{snapshot / 'v1.base' / 'data.json'}: 1 user (--env hf://{REPO})",
        f"{snapshot / 'v1.extra' / 'data.json'}: 3 users (--env hf://{REPO}/v1.extra/data.json)",
        f"dataset {REPO} at commit {COMMIT}; to pin it: --env hf://{REPO}@{COMMIT}[/FILE]",
    ]
    assert _files(offline_env) == before  # found in the cache: nothing written


def test_pull_of_one_file_accepts_the_hf_prefix(
    cached: dict[str, Path], offline_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["env", "pull", f"hf://{REPO}/v1.base"]) == 0
    out = capsys.readouterr().out.splitlines()
    local = offline_env / "datasets--AGI-Eval--AMemGym" / "snapshots" / COMMIT / DEFAULT_FILE
    assert out[0] == f"{local}: 1 user (--env hf://{REPO})"
    assert out[1] == f"dataset {REPO} at commit {COMMIT}; to pin it: --env hf://{REPO}@{COMMIT}"


@pytest.mark.parametrize(
    "argv",
    [
        ["env", "pull", REPO],
        ["env", "pull", f"hf://{REPO}/v1.base/data.json"],
        ["env", "validate", f"hf://{REPO}"],
        ["env", "check", f"hf://{REPO}", "--json", "never-written.json"],
    ],
)
def test_offline_without_cache_is_one_line_and_writes_nothing(
    argv: list[str],
    offline_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("memloop: error: hf://" if "hf://" in argv[2] else "memloop: error:")
    assert REPO in lines[0] and "not in the Hugging Face cache" in lines[0]
    assert "HF_HUB_OFFLINE=0 memloop env pull AGI-Eval/AMemGym" in lines[0]
    assert "local data.json" in lines[0]
    assert _files(tmp_path) == before


def test_load_items_without_cache_raises_a_user_error(offline_env: Path) -> None:
    with pytest.raises(
        UserError, match=r"^hf://AGI-Eval/AMemGym@v9: .*, revision v9\) is not in the"
    ):
        load_items(f"hf://{REPO}@v9")
    assert not offline_env.exists()


def test_a_file_missing_from_the_cached_snapshot_is_the_same_error(
    cached: dict[str, Path],
) -> None:
    with pytest.raises(UserError, match=r"dataset AGI-Eval/AMemGym \(v2/data.json\) is not in the"):
        load_items(f"hf://{REPO}/v2")


@pytest.mark.parametrize(
    "name",
    [
        "hf://justone",
        "hf://",
        "hf://AGI-Eval/",
        "hf://a/b@",
        "hf://bad name/x",
        "hf://a/b/../c.json",
    ],
)
def test_bad_names_are_one_line_exit_2(
    name: str, offline_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["env", "pull", name], ["env", "validate", name]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert captured.out == "" and len(lines) == 1
        assert lines[0].startswith(f"memloop: error: {name}: ")
        assert "hf://OWNER/NAME" in lines[0]
    assert not offline_env.exists()


def test_parse_ref() -> None:
    assert parse_ref("AGI-Eval/AMemGym") == HfRef(REPO)
    assert parse_ref("hf://AGI-Eval/AMemGym@refs%2Fpr%2F1/v1.base") == HfRef(
        REPO, "refs/pr/1", "v1.base/data.json"
    )
    ref = parse_ref("hf://AGI-Eval/AMemGym@v1/x/y.json")
    assert ref.file == "x/y.json" and ref.uri() == "hf://AGI-Eval/AMemGym@v1/x/y.json"
    assert parse_ref("hf://AGI-Eval/AMemGym/v1.base/data.json").uri() == "hf://AGI-Eval/AMemGym"


def test_an_invalid_cached_file_names_its_problem(
    cached: dict[str, Path], offline_env: Path
) -> None:
    snapshot = offline_env / "datasets--AGI-Eval--AMemGym" / "snapshots" / COMMIT
    (snapshot / "broken").mkdir()
    (snapshot / "broken" / "data.json").write_text("[]")
    with pytest.raises(
        UserError, match=r"^hf://AGI-Eval/AMemGym/broken: \(top level\): the list holds no"
    ):
        load_items(f"hf://{REPO}/broken")


def test_an_experiment_and_eval_take_an_hf_reference(
    cached: dict[str, Path], tmp_path: Path
) -> None:
    import yaml

    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.runs.inputs import load_environment

    (tmp_path / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "environment": {"path": f"hf://{REPO}/v1.extra", "train_users": 1},
                "policy": str(paths.REPO / "memloop/experiments/policies/awi.yaml"),
            }
        )
    )
    config = load_config(tmp_path / "exp.yaml", EvolveConfig)
    assert config.environment.path == f"hf://{REPO}/v1.extra"  # a URI, not a relative path
    items, described = load_environment(config.environment)
    assert [i.id for i in items] == _ids(cached["v1.extra/data.json"])
    import hashlib

    expected = hashlib.sha256(cached["v1.extra/data.json"].read_bytes()).hexdigest()
    assert described == {"path": f"hf://{REPO}/v1.extra", "sha256": expected}
