"""Endpoint and model-file errors: user errors (see :mod:`memloop.core.errors`)."""

from memloop.core.errors import UserError


class EndpointUnreachable(UserError):
    """The endpoint refused or never answered the connection."""


class MissingApiKey(UserError):
    """The environment variable the endpoint config names for its key is unset."""


class ModelFileError(UserError):
    """The embedded model's weights are missing or fail their size / sha256 check."""


__all__ = ["EndpointUnreachable", "MissingApiKey", "ModelFileError", "UserError"]
