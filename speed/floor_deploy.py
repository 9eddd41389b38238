"""The floor for P1: a pyinfra run on the same hosts that only connects and reads one fact."""

from pyinfra import host
from pyinfra.facts.server import Hostname

host.get_fact(Hostname)
