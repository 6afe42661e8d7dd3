"""Command-line interface: parse, call, print. Nothing here computes."""
