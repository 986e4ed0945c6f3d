"""The output folder of a generation run.

Per-user, per-step JSON files under raw/<user_id>/ (written atomically; a file that exists is a
finished step), the run's config and report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, safe_name


class RunStore:
    """Files of an output folder: config.json, report.json, data.json and raw/<user>/<step>.json."""

    def __init__(self, out_dir: str | Path) -> None:
        self.root = Path(out_dir)

    @property
    def data_path(self) -> Path:
        return self.root / "data.json"

    @property
    def report_path(self) -> Path:
        return self.root / "report.json"

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    def user_dir(self, user_id: str) -> Path:
        return self.root / "raw" / safe_name(user_id)

    def step_path(self, user_id: str, step: str) -> Path:
        return self.user_dir(user_id) / f"{step}.json"

    def load_step(self, user_id: str, step: str) -> dict[str, Any] | None:
        """The saved record of a finished step, or None (missing or unreadable: redo the step)."""
        path = self.step_path(user_id, step)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) and "result" in record else None

    def save_step(self, user_id: str, step: str, record: dict[str, Any]) -> None:
        atomic_write_json(self.step_path(user_id, step), record, indent=2)

    def check_config(self, fingerprint: dict[str, Any], config_dump: dict[str, Any]) -> bool:
        """Record the run's settings on first use; on a rerun require the same generation settings.

        Returns True when earlier work exists in this folder (a resume).
        """
        previous = None
        if self.config_path.is_file():
            try:
                previous = json.loads(self.config_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                previous = None
        if isinstance(previous, dict) and isinstance(previous.get("fingerprint"), dict):
            old = previous["fingerprint"]
            for key in sorted(set(old) | set(fingerprint)):
                if old.get(key) != fingerprint.get(key):
                    raise UserError(
                        f"{self.root}: holds a run made with {key}={old.get(key)!r}, but this run "
                        f"has {key}={fingerprint.get(key)!r}; use another --out folder (or delete "
                        "it) to generate with different settings"
                    )
        elif (self.root / "raw").is_dir() and any((self.root / "raw").iterdir()):
            raise UserError(
                f"{self.root}: holds raw/ step files but no readable config.json; "
                "use an empty --out folder"
            )
        atomic_write_json(
            self.config_path, {"fingerprint": fingerprint, "config": config_dump}, indent=2
        )
        return previous is not None
