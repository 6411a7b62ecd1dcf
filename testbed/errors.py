"""User-facing errors: the CLI prints their message as one line and exits non-zero, no traceback."""


class UserError(Exception):
    """A mistake the user can fix (bad config, missing file, unreachable broker)."""


class ConfigError(UserError):
    """A bad experiment file or override; the message names the key."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"config error: {key}: {problem}")


class DataError(UserError):
    """A data file that is missing, corrupt or does not fit the experiment."""
