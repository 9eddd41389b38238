"""The specfleet lab: real Debian hosts booted with systemd-nspawn, a local
Hugging Face-compatible hub and a local Python package index, so that every
deploy feature can be exercised without GPUs.

Stand-ins (labelled as such in their own files): the GPU itself (an
``nvidia-smi`` stand-in answering from profiles built from real captured
output) and the SGLang engine (a ``sglang`` distribution that parses the real
0.5.23 flag list and serves the real endpoints with deterministic output).
"""
