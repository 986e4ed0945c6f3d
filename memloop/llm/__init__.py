"""Model endpoints.

Configuration, the embedded local model, the shared chat client (cache, retries, concurrency
bound, token accounting) and a DSPy LM over the same client.
"""

from memloop.llm.cache import ResponseCache
from memloop.llm.client import ChatClient, ChatResult, LLMRequestError
from memloop.llm.endpoint import Endpoint
from memloop.llm.errors import EndpointUnreachable, MissingApiKey, ModelFileError, UserError
from memloop.llm.usage import UsageTracker

__all__ = [
    "ChatClient",
    "ChatResult",
    "Endpoint",
    "EndpointUnreachable",
    "LLMRequestError",
    "MissingApiKey",
    "ModelFileError",
    "ResponseCache",
    "UsageTracker",
    "UserError",
]
