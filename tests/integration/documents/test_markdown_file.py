"""`mtkit translate --format markdown` with a trained model (the reverse task, where each target letter aligns to its
source letter): emphasis and links go around the reversed letters, code and everything between blocks is kept."""

from __future__ import annotations

from pathlib import Path

from helpers import invoke, succeeded

PAGE = """\
# a b *c* d e

- b **c d** [e](http://x.org/y_z "T") f
- `code` a b c d

```
kept *as is*
```
"""


def test_a_markdown_file_is_translated_with_its_markup_around_the_reversed_letters(reverse_run, tmp_path: Path) -> None:
    source, output = tmp_path / "page.md", tmp_path / "out.md"
    source.write_text(PAGE, encoding="utf-8")
    succeeded(invoke("translate", "-m", reverse_run.run_path, "-i", source, "-o", output, "--format", "markdown", "--beam", "2"))
    assert output.read_text(encoding="utf-8") == PAGE.replace("a b *c* d e", "e d *c* b a").replace(
        '- b **c d** [e](http://x.org/y_z "T") f\n- `code` a b c d', '- f [e](http://x.org/y_z "T") **d c** b\n- `code` d c b a'
    )
