"""Credentials kept out of what memloop stores and sends: by name, by shape, in URLs.

A run's settings are stored with it (spec.json, checkpoints, MLflow params, exports), so a
credential may reach memloop only through an environment variable it names (`api_key_env`,
`<field>_env`). These checks refuse what would put one in a stored setting: a field named like a
credential (`looks_secret`), a value shaped like one under any name
(`looks_like_a_secret_value`: `sk-...`, `Bearer ...`, JWTs, provider tokens) and a URL that
carries one (`url_problem`: user info, a secret-looking query parameter, a fragment). Endpoint
files (llm/endpoint.py), mem0 store settings (policies/mem0_options.py) and tracking URIs
(runs/tracker_store.py) all refuse through them; no message echoes the value.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

KEY_HINT = "put the key in an environment variable named by api_key_env"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
OPENAI_HOST = "api.openai.com"  # the one host the default key variable is sent to
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an environment variable's name
# words that name a credential wherever they stand in a field name
_SECRET_WORDS = {
    "auth",
    "authorization",
    "bearer",
    "cookie",
    "credential",
    "credentials",
    "passphrase",
    "passwd",
    "password",
    "secret",
    "secrets",
    "jwt",
    "sig",
    "signature",
    "session",
    "pat",
    "keys",
    "apikeys",
}
# credentials by their shape, under any name: OpenAI-style keys, bearer headers, JSON web
# tokens, GitHub, Hugging Face, AWS and Slack tokens
_SECRET_VALUE = re.compile(
    r"^\s*(?:sk-[A-Za-z0-9_-]{16,}|bearer\s+\S{8,}|basic\s+[A-Za-z0-9+/=]{8,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})",
    re.IGNORECASE,
)


def looks_like_a_secret_value(value: Any) -> bool:
    """Whether a text is shaped like a credential (`sk-...`, `Bearer ...`, a JWT, ...)."""
    return isinstance(value, str) and bool(_SECRET_VALUE.match(value))


# named like a key but not one: OpenAI's prompt_cache_key routes requests to a cache
_NOT_SECRETS = {"prompt_cache_key"}


def _words(name: str) -> list[str]:
    """The lower-case words of a field name: api_key, x-api-key, apiKey and APIKey give api, key."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)]


def looks_secret(name: str) -> bool:
    """Whether a field named `name` looks like it holds a credential.

    A word key, token, secret, password or authorization (also glued, as in apikey or
    accesstoken) is one; plural and id forms (max_completion_tokens, stop_token_ids) are not.
    """
    if name.lower() in _NOT_SECRETS:
        return False
    words = _words(name)
    if words == ["tokens"]:  # a field named just "tokens" (not max_tokens, budget_tokens)
        return True
    for i, word in enumerate(words):
        if word in _SECRET_WORDS or word.startswith(("secret", "password", "passwd")):
            return True
        after = words[i + 1] if i + 1 < len(words) else ""
        if word.endswith(("key", "token")) and after not in ("id", "ids"):
            return True
    return False


def secret_path(value: Any, path: str = "") -> str | None:
    """The path of the first secret-looking key or value in `value` (mappings and lists in it)."""
    if looks_like_a_secret_value(value):
        return path or "value"
    if isinstance(value, dict):
        for key, inner in value.items():
            here = f"{path}.{key}" if path else str(key)
            if looks_secret(str(key)):
                return here
            found = secret_path(inner, here)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, inner in enumerate(value):
            found = secret_path(inner, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def url_problem(url: str, *, user_allowed: bool = False) -> str | None:
    """Why `url` may not be stored with a run, or None; never echoes the URL.

    User info before '@' (a user name or password), a query parameter named like a credential
    or holding a credential-shaped value, and a fragment (a server never receives it; a key
    pasted there would only be stored) are refused. `user_allowed`: a database URL's user name
    alone (`postgresql://memloop@host/db`) is kept; a password after it is still refused.
    """
    rest = url.split("//", 1)[-1]
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority:
        user = authority.rsplit("@", 1)[0]
        if not user_allowed:
            return (
                "holds a user name or password before '@', which would be stored with the run "
                "(spec.json, MLflow)"
            )
        if ":" in user or looks_like_a_secret_value(user):
            return (
                "holds a password before '@', which would be stored with the run (spec.json, "
                "MLflow)"
            )
    if "#" in url:
        return (
            "has a fragment (after '#'), which a server never receives and which would be "
            "stored with the run (spec.json, MLflow)"
        )
    for name, given in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        # a database driver's TLS files (sslkey, sslcert, ssl_key=/path/key.pem) are locations
        named = looks_secret(name) and not name.lower().startswith("ssl")
        if named or looks_like_a_secret_value(given):
            return (
                f"has a query parameter {name!r} that looks like a secret, which would be stored "
                "with the run (spec.json, MLflow)"
            )
    return None


STORE_KEY_HINT = (
    "give credentials in the environment: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
    "for an MLflow server, PGPASSWORD or ~/.pgpass for PostgreSQL, MYSQL_PWD for MySQL"
)


def store_url_problem(url: str) -> str | None:
    """`url_problem` of a tracking URI or an Optuna storage URL, with where credentials go.

    A database URL may name its user (`postgresql://memloop@host/db`); an MLflow server's
    may not (MLflow reads its user and password from the environment).
    """
    problem = url_problem(url, user_allowed=not url.lower().startswith(("http:", "https:")))
    return None if problem is None else f"{problem}: remove it and {STORE_KEY_HINT}"
