class HarnessError(Exception):
    """A problem the user can fix: printed as one line on stderr, no traceback."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
