"""P1's cost model: OPS operations, each reading COMMANDS one-command facts (`--data bench_ops=13
bench_commands=2`), so that the cost of one SSH round trip and of one operation can be measured
with the same pyinfra startup and connection as the floor."""

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.server import Command


@operation()
def probe(index: int, commands: int):
    for i in range(commands):
        host.get_fact(Command, command=f"echo {index}.{i}")
    host.noop(f"{commands} commands")
    yield from ()


for index in range(int(host.data.get("bench_ops", 1))):
    probe(name=f"Probe {index}", index=index, commands=int(host.data.get("bench_commands", 0)))
