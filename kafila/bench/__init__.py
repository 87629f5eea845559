"""Benchmarks: `kafila bench NAME` runs one and writes a report."""
