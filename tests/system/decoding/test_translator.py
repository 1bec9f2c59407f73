"""`mtkit translate` in a child process answers a line piped in before its input ends."""

from __future__ import annotations


def test_a_line_piped_in_is_answered_before_the_input_ends(reverse_run):
    """`(echo ...; sleep) | mtkit translate` must print while its input is still open."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "mtkit", "translate", "-m", str(reverse_run.run_path), "--beam", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        process.stdin.write(b"a b c\n")
        process.stdin.flush()
        # stdin stays open: a translator that waited for the end of input would never answer.
        assert process.stdout.readline() == b"c b a\n"
        process.stdin.write(b"e f g\n")
        process.stdin.flush()
        assert process.stdout.readline() == b"g f e\n"
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert process.returncode == 0
