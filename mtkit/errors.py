"""The one exception type for user mistakes: the CLI prints its message as one line, no traceback.

`OptionError` is the kind that concerns an option of a request (a decoding setting, a target
language): it carries the options it names, so each front end words it its own way: the CLI as
`--no-repeat-ngram -1: ...`, the server as its JSON fields, `no_repeat_ngram -1: ...`.
"""

from __future__ import annotations

from collections.abc import Callable


class MtkitError(Exception):
    """A problem the user can fix (bad file, bad key, bad option).

    The message is one line that names the file, line or key and says what to do.
    """


def cli_flag(option: str) -> str:
    """An option as the command line spells it: no_repeat_ngram -> --no-repeat-ngram."""
    return "--" + option.replace("_", "-")


class OptionError(MtkitError):
    """A mistake in one option: `option` (a Python name such as "no_repeat_ngram") and the message as a
    template in which every option is a field, e.g. "{beam} {value} with {sampling}: leave {beam} out".

    `values` fill the other fields (the bad value, a count). `worded(name)` spells each option with
    `name`; `str(error)` is the command line's wording.
    """

    def __init__(self, option: str, template: str, **values: object) -> None:
        self.option, self.template, self.values = option, template, values
        super().__init__(self.worded(cli_flag))

    def worded(self, name: Callable[[str], str]) -> str:
        """The message with every option spelt by `name` (e.g. as a request's field)."""
        return self.template.format_map(_Fields(name, self.values))


class _Fields(dict):
    """A template's fields: the given values, and any other name as an option spelt by `name`."""

    def __init__(self, name: Callable[[str], str], values: dict[str, object]) -> None:
        super().__init__(values)
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name(key)


def one_line(err: BaseException, limit: int = 160) -> str:
    """A library's error message flattened to one line of at most `limit` characters, to quote in ours."""
    return " ".join(str(err).split())[:limit]
