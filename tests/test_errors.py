"""The user-facing error: one line, however many lines the library's message had."""

from __future__ import annotations

from mtkit.errors import MtkitError, OptionError, cli_flag, one_line


def test_one_line_flattens_and_cuts_a_library_message():
    err = ValueError("first line\n   second\tline   \n" + "x" * 400)
    flat = one_line(err)
    assert "\n" not in flat and flat.startswith("first line second line x") and len(flat) == 160
    assert one_line(err, limit=10) == "first line"


def test_the_error_type_carries_its_message():
    assert str(MtkitError("data.yaml: key 'x' is unknown")) == "data.yaml: key 'x' is unknown"


def test_an_option_error_is_worded_by_each_front_end():
    err = OptionError("no_repeat_ngram", "{no_repeat_ngram} {value}: give 3, or leave {beam_size} out", value=-1)
    assert isinstance(err, MtkitError)
    assert str(err) == "--no-repeat-ngram -1: give 3, or leave --beam-size out"  # the command line's wording
    assert err.worded(lambda option: option) == "no_repeat_ngram -1: give 3, or leave beam_size out"
    assert err.option == "no_repeat_ngram" and cli_flag("tgt_lang") == "--tgt-lang"


def test_an_option_errors_values_keep_their_conversions():
    err = OptionError("flag_rule", "{flag_rule} {item}: {value!r} is not a number", item="x=a", value="a")
    assert str(err) == "--flag-rule x=a: 'a' is not a number"
