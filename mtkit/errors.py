"""The one exception type for user mistakes: the CLI prints its message as one line, no traceback."""


class MtkitError(Exception):
    """A problem the user can fix (bad file, bad key, bad option).

    The message is one line that names the file, line or key and says what to do.
    """
