"""A `dspy.LM` whose calls go through memloop's ChatClient.

Same endpoint, cache, retries, concurrency bound and token accounting, via DSPy 3.4's
custom-engine contract.
"""

from __future__ import annotations

from typing import Any

from memloop.llm.client import ChatClient


class ChatClientEngine:
    """DSPy engine: complete(Request) -> Response, one attempt, backed by a ChatClient."""

    def __init__(self, client: ChatClient, component: str):
        self.client = client
        self.component = component

    def complete(self, request: Any) -> Any:
        from dspy.clients.lm15_boundary import request_kwargs, response_value

        data = request_kwargs(request, "chat")
        messages = data.pop("messages")
        schema = None
        response_format = data.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            schema = response_format.get("json_schema", {}).get("schema")
        max_tokens = data.get("max_tokens") or data.get("max_completion_tokens")
        result = self.client.chat(
            messages,
            component=self.component,
            schema=schema,
            temperature=data.get("temperature"),
            max_tokens=max_tokens,
            stop=data.get("stop"),
        )
        body = {
            "id": "memloop",
            "object": "chat.completion",
            "created": 0,
            "model": result.model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": result.finish_reason or "stop",
                    "message": {"role": "assistant", "content": result.text},
                }
            ],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }
        return response_value(body, "chat", request)

    def stream(self, request: Any):  # pragma: no cover - memloop never streams
        raise NotImplementedError("memloop's DSPy engine does not stream")

    def close(self) -> None:
        pass


def make_dspy_lm(client: ChatClient, component: str = "memory") -> Any:
    """Build a dspy.LM for `client`'s endpoint.

    Pass it explicitly (dspy.context), never globally.
    """
    import dspy

    endpoint = client.endpoint
    return dspy.LM(
        f"openai/{client.api_model_name}",
        engine=ChatClientEngine(client, component),
        temperature=endpoint.temperature,
        max_tokens=endpoint.max_tokens,
        cache=False,  # the ChatClient's response cache is the single cache
        num_retries=0,  # and its retry policy the single retry policy
    )
