"""Kafila: pool a trusted group's machines into one ring that serves an LLM."""

__version__ = "0.1.0"
