"""The one exception type for user mistakes.

A UserError is printed as a single line and exits non-zero; anything else is a
bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem the user can fix: bad config, missing file, malformed data."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
