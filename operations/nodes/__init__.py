"""One model over several nodes: node groups declared in the inventory (`group`), and their checks:
every node reaches rank 0 before anything slow, each rank >= 1 joined after the start (`rendezvous`)."""
