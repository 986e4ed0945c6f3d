"""Test-wide isolation: every test session writes its caches, logs and runs under a temp folder,
while the (large) joined model files are shared with the user cache so they are built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memloop.core.settings import cache_root

_session_root = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_root
    import tempfile

    os.environ.setdefault("MEMLOOP_MODELS_DIR", str(cache_root() / "models"))
    _session_root = Path(tempfile.mkdtemp(prefix="memloop-tests-"))
    os.environ["MEMLOOP_CACHE_DIR"] = str(_session_root / "cache")
    # episode traces cost a store transaction per span: only the tests of traces log them
    # (tests/runs/test_traces.py, tests/results/test_mlflow_ui_browser.py set it back)
    os.environ["MEMLOOP_TRACES"] = "0"
    # `memloop eval` logs to $MLFLOW_TRACKING_URI (else ./mlruns): never the checkout's store
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_session_root}/mlruns/mlflow.db"
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()


@pytest.fixture(autouse=True)
def _tracking_uri_kept():
    """$MLFLOW_TRACKING_URI as each test found it: mlflow.set_tracking_uri (every store memloop
    opens) sets it for the whole process, and a later test's eval would log to that store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture
def traces_on(monkeypatch):
    """Episode traces logged, as outside the tests (`MEMLOOP_TRACES` unset)."""
    monkeypatch.delenv("MEMLOOP_TRACES")


@pytest.fixture(scope="session")
def session_root() -> Path:
    assert _session_root is not None
    return _session_root


@pytest.fixture(scope="session")
def local_client(session_root: Path):
    """A ChatClient on the embedded 0.5B model (the fast one), shared by the real-model tests."""
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint

    client = ChatClient(
        Endpoint(model="local-0.5b", max_concurrency=2, timeout_s=300),
        cache=session_root / "real-model-cache.sqlite",
    )
    yield client
    client.close()


@pytest.fixture(params=["plain-http", "sdk"])
def transport(request, monkeypatch):
    """Both ways a request reaches an endpoint: the standard library's keep-alive connection
    (plain http://, what the loopback fake gets by default) and the OpenAI SDK over httpx2 (https
    and proxied endpoints), forced here by making the plain path unusable."""
    if request.param == "sdk":
        monkeypatch.setattr("memloop.llm.plain_http.usable", lambda base_url: False)
    return request.param


@pytest.fixture
def no_progress_bars(monkeypatch):
    """Progress bars off: they are drawn on stderr too, and are not error lines (tests that read
    a command's stderr line by line use it)."""
    import tqdm

    class Quiet(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tqdm, "tqdm", Quiet)
    # and no plain progress lines (drawn instead of bars when stderr is not a terminal)
    monkeypatch.setattr("memloop.environment.episode.on_terminal", lambda: True)


@pytest.fixture
def mem0_fake():
    """The scripted loopback LLM that plays mem0's extraction and reconciliation for one user
    (memloop.testing.scripted_llm: a city that changes, and the cello); `.script` holds the
    requests it answered."""
    from memloop.testing.fake_server import FakeOpenAIServer
    from memloop.testing.scripted_llm import ScriptedMemoryLLM, actions_of, facts_of

    script = ScriptedMemoryLLM(facts=facts_of, actions=actions_of)
    with FakeOpenAIServer(reply=script) as server:
        server.script = script
        yield server


@pytest.fixture
def mem0_client(mem0_fake, tmp_path: Path):
    """A ChatClient on `mem0_fake`."""
    from memloop.testing.scripted_llm import loopback_client

    return loopback_client(mem0_fake, tmp_path)
