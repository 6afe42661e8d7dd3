"""The seeds: the five tutorials on Add & Norm whose code and claims addnorm reproduces and measures. The help
and the tour call them "seed 000" to "seed 004"; this table says which text each number is."""

import textwrap

SEEDS = {
    "000": "\"L05 - Normalization & Residuals: The Plumbing of Deep Networks\": Add & Norm as one unit, LayerNorm "
           "from scratch, a transformer block around multi-head attention",
    "001": "\"6. Layer Normalization\": a tiny transformer on '<BOS> I like transformers <EOS>' with LayerNorm "
           "written out in pure Python, position by position",
    "002": "\"Residual Connection and LayerNorm\" (a book's chapter 10): a post-norm attention sub-layer in NumPy "
           "and in PyTorch",
    "003": "\"Residual Connections & Layer Normalization\": why deep stacks need both, pre- vs post-norm, "
           "LayerNorm vs RMSNorm",
    "004": "\"Step 10: Residual connections and layer normalization\": the same with the MAX framework",
}


def seeds_text(numbers=None, width: int = 79) -> str:
    """The table (or the rows of ``numbers``) as the help prints it, wrapped to ``width``."""
    rows = [textwrap.fill(f"seed {n}  {text}", width, initial_indent="  ", subsequent_indent=" " * 12,
                          break_on_hyphens=False)
            for n, text in SEEDS.items() if numbers is None or n in numbers]
    return "seeds, the tutorials whose code and claims addnorm measures:\n" + "\n".join(rows)


def mentioned(text: str) -> list[str]:
    """The seed numbers a help text names ("seed 001's ..." -> ["001"])."""
    return [n for n in SEEDS if f"seed {n}" in text]
