"""Benchmarks and correctness gates against any OpenAI-compatible server (see bench/README.md)."""

from hyperqwen.bench.cli import register

__all__ = ["register"]
