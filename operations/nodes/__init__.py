"""One model over several nodes (node groups: deployment/nodes/group.py), and their checks: every node reaches
rank 0 before anything slow, each rank >= 1 joined after the start (`rendezvous`)."""
