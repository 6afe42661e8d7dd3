"""Published numbers the study is compared with, as data, each with its citation and the scale it was measured at
(so that a comparison can state how far the study's scale is from the paper's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    """One published result."""

    key: str
    result: str  # what the paper reports, in its terms
    scale: str  # models, data and budget it was measured at
    params: tuple[float, float]  # smallest and largest model, parameters
    refs: tuple[tuple[str, str], ...]  # (citation: authors, title, venue; its arXiv id), one per paper
    tokens: tuple[float, float] | None = None  # training tokens compared, where the result is about a budget

    @property
    def arxiv(self) -> tuple[str, ...]:
        return tuple(a for _, a in self.refs)


def url(arxiv: str) -> str:
    return f"https://arxiv.org/abs/{arxiv}"


_MIXLN = ("Li, Yin and Liu, Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and Post-LN (ICLR 2025)",
          "2412.13795")
_LNS = ("Sun et al., The Curse of Depth in Large Language Models (LayerNorm Scaling, 2025)", "2502.05795")
_LLAMA_C4 = "LLaMA-style models from 71M to 1B parameters trained on C4"

PUBLISHED = {p.key: p for p in (
    Published("post_diverges", "Post-LN diverges from the 250M model up", _LLAMA_C4, (71e6, 1e9), (_MIXLN, _LNS)),
    Published("lns_beats_pre", "LayerNorm Scaling (the norm's output scaled by 1/sqrt(l)) reaches a lower perplexity "
              "than Pre-LN at every model size", _LLAMA_C4, (71e6, 1e9), (_LNS,)),
    Published("mixln_1b", "Mix-LN (Post-LN in the first layers, Pre-LN after) outperforms Pre-LN in its own paper's "
              "LLaMA pre-training on C4; the LayerNorm Scaling paper's tables disagree with it at 1B", _LLAMA_C4,
              (71e6, 1e9), (_MIXLN, _LNS)),
    Published("mhc_gain", "composite mixing gain (Amax gain magnitude of the products of H_res over depth): about "
              "3000 for HC, about 1.6 for mHC", "a 27B model", (27e9, 27e9),
              (("DeepSeek-AI, mHC: Manifold-Constrained Hyper-Connections (2025)", "2512.24880"),)),
    Published("denseformer", "DenseFormer (after each block, a learned weighted average of every earlier block's "
              "output) reaches a lower perplexity than a standard transformer of the same depth and size, and the "
              "perplexity of deeper ones", "language models on OpenWebText2 and PG-19", (0.0, 0.0),
              (("Pagliardini, Mohtashami, Fleuret and Jaggi, DenseFormer: Enhancing Information Flow in Transformers "
                "via Depth Weighted Averaging (NeurIPS 2024)", "2402.02622"),)),
    Published("hybridnorm", "HybridNorm (QKV normalization in attention, Post-Norm in the FFN) outperforms both Pre-Norm "
              "and Post-Norm in dense and Mixture-of-Experts language models", "a 1.2B dense model (16 layers, d_model "
              "2048, 1T tokens) and a Mixture-of-Experts model of 6.9B parameters (1.3B active, 500B tokens), at "
              "Megatron's init (output projections scaled by 1/sqrt(2L)), as the released configs set them",
              (1.2e9, 6.9e9),
              (("Zhuo et al., HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid Normalization "
                "(2025)", "2503.04598"),), tokens=(5e11, 1e12)),
    Published("ngpt", "nGPT (every vector normalized to the unit hypersphere) reaches the same accuracy in 4 to 20 times "
              "fewer training steps than GPT, depending on the sequence length", "0.5B and 1B models on OpenWebText, "
              "contexts of 1k to 8k tokens", (0.5e9, 1e9),
              (("Loshchilov, Hsieh, Sun and Ginsburg, nGPT: Normalized Transformer with Representation Learning on "
                "the Hypersphere (ICLR 2025)", "2410.01131"),)),
    Published("value_residual", "ResFormer (each layer's values mixed with the first layer's) reaches the same validation "
              "loss as a Transformer with 16.11 % fewer parameters and 20.3 % less training data", "language models "
              "(the paper's v5)", (0.0, 0.0),
              (("Zhou, Wu, Jiang, Obeid and Lan, Value Residual Learning (ACL 2025)", "2410.17897"),)),
    Published("derf", "Derf (gamma erf(alpha x + s) + beta in place of the norm) outperforms LayerNorm, RMSNorm and DyT "
              "across image classification and generation, speech, DNA and language modelling", "ViT and DiT on "
              "ImageNet, wav2vec 2.0, DNA sequence models and GPT-2", (0.0, 0.0),
              (("Chen, Lu, Zhu, Sun and Liu, Stronger Normalization-Free Transformers (2025)", "2512.10938"),)),
    Published("dyt_budget", "DyT in place of the norm changes the loss by -27 % at 1M training tokens and by +19 % at "
              "118M: the sign of its effect flips with the token budget", "small language models at token budgets "
              "from 1M to 118M", (0.0, 0.0),
              (("a 2026 study of Dynamic Tanh (DyT) across token budgets", "2604.23434"),), (1e6, 118e6)),
)}


def _times(x: float) -> str:
    return f"{x:,.0f}×" if x >= 10 else f"{x:.2g}×"


def _ratio(lo: float, hi: float) -> str:
    return _times(lo) if lo == hi else f"{_times(lo)}–{_times(hi)}"


def scale_gap(p: Published, n_params: int | tuple[int, int] | None, tokens: int | None = None) -> str:
    """The paper's scale in words and, where both are known, how many times the study's it is: 'its models are
    58x-820x the study's 1.2M parameters' (``n_params``: one count, or the (smallest, largest) of the runs)."""
    out = f"Paper's scale: {p.scale}"
    lo, hi = (n_params, n_params) if isinstance(n_params, int | float) else (n_params or (None, None))
    if lo and p.params[1]:
        a_, b_ = f"{lo / 1e6:.2g}M", f"{hi / 1e6:.2g}M"
        mine = a_ if a_ == b_ else f"{a_}–{b_}"  # one number where the range rounds to one
        out += f"; its models are {_ratio(p.params[0] / hi, p.params[1] / lo)} the study's {mine} parameters"
    if tokens and p.tokens:
        out += f"; its budgets are {_ratio(p.tokens[0] / tokens, p.tokens[1] / tokens)} the study's {tokens:,} tokens"
    return out
