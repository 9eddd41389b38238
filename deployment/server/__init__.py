"""The SGLang servers a deployment runs: its users and paths, engine and replicas (config), the speculative
algorithm table (speculative), the layout of its GPUs (layout), its command line (command_line) and the KV
cache planner (capacity, resident)."""
