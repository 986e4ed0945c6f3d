"""What every memloop package shares, and nothing else.

User errors, config loading, atomic files, hashing, safe names, tables and process-wide offline
defaults.

``memloop.core`` imports nothing from the rest of memloop; every other layer may import it.
"""

from memloop.core.config import load_yaml_mapping, load_yaml_model, parse_model, resolve_relative
from memloop.core.errors import UserError, exit_on_user_error
from memloop.core.files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_writer,
    file_sha256,
    json_sha256,
    safe_name,
)
from memloop.core.settings import apply_offline_defaults, cache_root
from memloop.core.tables import format_table

__all__ = [
    "UserError",
    "apply_offline_defaults",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_writer",
    "cache_root",
    "exit_on_user_error",
    "file_sha256",
    "format_table",
    "json_sha256",
    "load_yaml_mapping",
    "load_yaml_model",
    "parse_model",
    "resolve_relative",
    "safe_name",
]
