"""Tests that need no lab: parsers, rendering, command generation."""
