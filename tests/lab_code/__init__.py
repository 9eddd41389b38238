"""Tests of the lab's own code (lab/): the GPU and SGLang stand-ins, the hub, the package index, the hosts, the CLI.

The rule: a test sits here when what it checks is lab/ code; a test of the product sits in
tests/unit (no lab host: pure logic, facts in, commands out, host scripts; it may start the lab
hub locally, tests/lab_hub.py), tests/lab and tests/faults (the deploy run against lab hosts) or
tests/deployed (testinfra checks of deployed hosts, the lab's or real ones).
"""
