"""Joining packaged model parts: atomic build, size + sha256 check, removal and rebuild of a
corrupt or truncated file."""

from __future__ import annotations

import hashlib
import sys

import pytest

from memloop.llm.errors import ModelFileError
from memloop.llm.model_files import PackagedModel, ensure_model_file, resolve_packaged_model


@pytest.fixture
def tiny_model(tmp_path, monkeypatch):
    """A two-part 'model' shipped as two importable modules, like the real weight packages."""
    parts = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33]
    for i, data in enumerate(parts, start=1):
        pkg = tmp_path / "site" / f"tiny_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / "part.bin").write_bytes(data)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            "    return os.path.join(os.path.dirname(__file__), 'data', 'part.bin')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(parts)
    yield PackagedModel(
        key="tiny",
        display_name="Tiny",
        file_name="tiny.gguf",
        part_modules=("tiny_part1", "tiny_part2"),
        pip_extra="tiny",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    for name in ("tiny_part1", "tiny_part2"):
        sys.modules.pop(name, None)


def test_joins_once_and_verifies(tiny_model, tmp_path):
    path = ensure_model_file(tiny_model, tmp_path / "models")
    assert path.stat().st_size == tiny_model.size
    assert not list((tmp_path / "models").glob("*.part"))  # temp file renamed away
    mtime = path.stat().st_mtime_ns
    assert ensure_model_file(tiny_model, tmp_path / "models") == path
    assert path.stat().st_mtime_ns == mtime  # not rebuilt


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_file_detected_removed_and_rebuilt(tiny_model, tmp_path, damage):
    path = ensure_model_file(tiny_model, tmp_path / "models")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="removed and will be rebuilt"):
        ensure_model_file(tiny_model, tmp_path / "models")
    assert not path.exists()
    assert ensure_model_file(tiny_model, tmp_path / "models").read_bytes() == b"".join(
        open(p, "rb").read() for p in _parts(tiny_model)
    )


def _parts(model):
    import importlib

    return [importlib.import_module(m).get_part_path() for m in model.part_modules]


def test_missing_weight_package_names_install_command(tmp_path):
    model = PackagedModel(
        key="x",
        display_name="X",
        file_name="x.gguf",
        part_modules=("no_such_weights_part1",),
        pip_extra="local-x",
        size=1,
        sha256="0" * 64,
    )
    with pytest.raises(ModelFileError, match=r"no-such-weights-part1.*local-x"):
        ensure_model_file(model, tmp_path)


def test_unknown_model_alias():
    with pytest.raises(ModelFileError, match="local-0.5b"):
        resolve_packaged_model("gpt-5")
    assert resolve_packaged_model("local").key.startswith("qwen2.5-coder-1.5b")


def test_a_models_folder_that_cannot_be_written_is_one_line(tiny_model, tmp_path):
    """A read-only MEMLOOP_MODELS_DIR (here: a path under a file, which no user can write)."""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ModelFileError, match="cannot write the model file tiny.gguf") as caught:
        ensure_model_file(tiny_model, tmp_path / "a-file" / "models")
    assert "set MEMLOOP_MODELS_DIR to a writable folder" in str(caught.value)
    assert "\n" not in str(caught.value)
