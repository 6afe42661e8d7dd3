"""Experiments: compose models, data and diagnostics into runs whose results are plain data (and files)."""
