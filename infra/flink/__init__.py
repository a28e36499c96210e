"""Flink connector resolution and cluster submission notes (see README.md)."""
