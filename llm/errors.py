"""Errors a user can cause and fix (bad file, bad config, endpoint down): the CLI prints the
message as one line and exits with code 2, never a traceback."""


class UserError(Exception):
    """A problem the user can fix; its message names the file, field or URL and what to do."""


class EndpointUnreachable(UserError):
    """The endpoint refused or never answered the connection."""


class MissingApiKey(UserError):
    """The environment variable the endpoint config names for its key is unset."""


class ModelFileError(UserError):
    """The embedded model's weights are missing or fail their size / sha256 check."""
