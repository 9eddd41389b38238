"""What to deploy, with no pyinfra in it: the knob table (schema), each knob's parser (knobs), the host classes
and the site's data (site_data), each host's deployments resolved from its data at once (hosts), what a host is
to the fleet (roles), the tuned files (tuned), and each subject's slice of a deployment (server, gpu, weights,
nodes, gateway, python). operations/ reads this model: its facts and operations act on what it says."""

# operations/__init__.py has pyinfra's CLI, which turns writing bytecode off, let these modules keep their
# compiled files too: a run that imports this package first (the group data does) runs it first.
import operations  # noqa: F401
