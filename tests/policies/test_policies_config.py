"""Policy configuration files: the shipped YAML files load, and every mistake a user can make ends
in one UserError line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from memloop.core.errors import UserError
from memloop.policies import (
    AWEConfig,
    AWIConfig,
    NativeConfig,
    RAGConfig,
    load_policy_config,
    parse_policy_config,
)
from memloop.testing.paths import REPO

SHIPPED = REPO / "memloop" / "experiments" / "policies"


@pytest.mark.parametrize(
    "name, cls, display",
    [
        ("native", NativeConfig, "native"),
        ("awi", AWIConfig, "awi-2-4"),
        ("awe", AWEConfig, "awe-2-4-30"),
        ("rag", RAGConfig, "rag-2-4-30"),
    ],
)
def test_shipped_policy_files_load(name, cls, display):
    config = load_policy_config(SHIPPED / f"{name}.yaml")
    assert type(config) is cls
    assert config.display_name == display


def test_paper_defaults_count_messages():
    config = AWEConfig()
    assert (config.update_freq, config.short_term_len, config.top_k) == (2, 4, 30)
    assert AWIConfig(name="mine").display_name == "mine"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_and_key(tmp_path):
    path = _write(tmp_path, "type: awe\nupdate_freq: 2\ntopk: 10\n")
    with pytest.raises(UserError) as err:
        load_policy_config(path)
    message = str(err.value)
    assert str(path) in message and "unknown key 'topk'" in message and "top_k" in message
    assert "\n" not in message


def test_key_of_another_policy_type_is_unknown(tmp_path):
    path = _write(tmp_path, "type: native\ntop_k: 5\n")
    with pytest.raises(UserError, match="unknown key 'top_k'"):
        load_policy_config(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("update_freq: 2\n", "missing key 'type'"),
        ("type: memgpt\n", "unknown policy type 'memgpt'"),
        ("type: awi\nupdate_freq: 0\n", "key 'update_freq'"),
        ("type: awe\ntop_k: many\n", "key 'top_k'"),
        ("- type: awe\n", "expected a mapping"),
        ("type: [awe\n", "not valid YAML"),
    ],
)
def test_bad_policy_files_fail_in_one_line(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_policy_config(path)
    assert expected in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_policy_config(tmp_path / "nope.yaml")


def test_inline_block_reports_its_location():
    with pytest.raises(UserError, match=r"exp.yaml \(policy\): unknown key 'x'"):
        parse_policy_config({"type": "rag", "x": 1}, "exp.yaml (policy)")
    with pytest.raises(UserError, match="expected a mapping"):
        parse_policy_config(["awe"], "exp.yaml (policy)")


def test_unknown_embedding_folder_is_a_user_error(tmp_path):
    from memloop.policies.embedder import resolve_embedding_model

    with pytest.raises(UserError, match="not a local sentence-transformers folder"):
        resolve_embedding_model(str(tmp_path / "no-model"))


def test_a_policy_yaml_names_the_prompts_it_starts_from(tmp_path):
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.policies import build_policy, load_policy_config
    from memloop.policies.programs import AWI_WRITER_INSTRUCTIONS

    path = tmp_path / "seed.yaml"
    path.write_text("type: awi\nprompts:\n  writer: Note the topic of the conversation only.\n")
    config = load_policy_config(path)
    client = ChatClient(Endpoint(model="m", base_url="http://127.0.0.1:9"), cache=None)
    policy = build_policy(config, client)
    assert policy.prompts() == {"writer": "Note the topic of the conversation only."}
    override = build_policy(config, client, prompts={"writer": "Other."})
    assert override.prompts() == {"writer": "Other."}
    assert build_policy(load_policy_config_text(tmp_path, "type: awi\n"), client).prompts() == {
        "writer": AWI_WRITER_INSTRUCTIONS
    }
    bad = load_policy_config_text(tmp_path, "type: awi\nprompts: {nope: x}\n")
    with pytest.raises(UserError, match="unknown prompt 'nope'"):
        build_policy(bad, client)


def load_policy_config_text(tmp_path, text):
    from memloop.policies import load_policy_config

    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_policy_config(path)


def test_the_writer_adapter_option_names_dspys_adapter_and_keeps_old_identities():
    import dspy

    from memloop.policies.awi import writer_adapter
    from memloop.policies.config import AWIConfig

    kinds = {n: type(writer_adapter(n, None)) for n in ("json", "chat", "xml")}
    assert kinds == {"json": dspy.JSONAdapter, "chat": dspy.ChatAdapter, "xml": dspy.XMLAdapter}
    assert isinstance(writer_adapter("two_step", dspy.LM("openai/x")), dspy.TwoStepAdapter)
    default = AWIConfig()
    assert "adapter" not in default.model_dump()  # a run made before the option keeps its key
    assert AWIConfig(adapter="two_step").model_dump()["adapter"] == "two_step"
    assert AWIConfig(adapter="two_step").display_name == "awi-2-4-twostep"
    assert AWIConfig.model_validate(AWIConfig(adapter="xml").model_dump()).adapter == "xml"
