"""The README's usage snippet runs as written (so the documentation cannot drift from the API)."""

from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_usage_snippet_runs():
    text = README.read_text()
    block = text.split("## Using it", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    ns: dict = {}
    exec(compile(block.replace("    ...", "    pass"), "README.md", "exec"), ns)  # noqa: S102 - our own README
    assert ns["addnorm"].last_backend() in ("cpu", "torch")
    assert ns["normed"].shape == (8, 1024, 768)
