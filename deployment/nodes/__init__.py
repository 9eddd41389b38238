"""Node groups: one server spanning several hosts, declared in the inventory (group)."""
