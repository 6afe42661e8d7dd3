"""The transformer built from addnorm's pieces: attention, feed-forward, residual sub-layers, GPT."""

from .attention import MultiHeadAttention
from .block import TransformerBlock
from .config import GPTConfig
from .feedforward import FeedForward
from .gpt import GPT
from .sublayer import ResidualSubLayer

__all__ = ["GPTConfig", "MultiHeadAttention", "FeedForward", "ResidualSubLayer", "TransformerBlock", "GPT"]
