"""Tests of the product that need no lab host: parsers, rendering, command generation, host scripts.

Some start the lab hub on 127.0.0.1 as the server a product part talks to (tests/lab_hub.py); tests of
the lab's own code sit in tests/lab_code.
"""
