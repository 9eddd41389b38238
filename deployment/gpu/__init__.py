"""What a host class's GPUs must be and the runtime they need (config, with the GPU smoke test's settings), and
what a GPU product is on any host (products)."""
