"""Benchmarks (not tests): see bench/README.md."""
