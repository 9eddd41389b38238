"""Tests of the product against the booted lab: the deploy through pyinfra on lab hosts (lab code: tests/lab_code)."""
