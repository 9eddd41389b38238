"""specfleet's pyinfra operations and facts, by subject."""
