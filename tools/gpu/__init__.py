"""The GPU capture and classify tools: a real host's nvidia-smi outputs, facts and smoke test as a fixture folder
(`python -m tools.gpu capture`), and the class such a folder tells (`python -m tools.gpu classify`)."""
