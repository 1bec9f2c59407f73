"""The one exception type for user mistakes: the CLI prints its message as one line, no traceback."""


class MtkitError(Exception):
    """A problem the user can fix (bad file, bad key, bad option).

    The message is one line that names the file, line or key and says what to do.
    """


def one_line(err: BaseException, limit: int = 160) -> str:
    """A library's error message flattened to one line of at most `limit` characters, to quote in ours."""
    return " ".join(str(err).split())[:limit]
