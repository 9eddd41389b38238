"""NVIDIA GPU hardware truth: parsers, pyinfra facts, the class check, operations, and a CLI."""
