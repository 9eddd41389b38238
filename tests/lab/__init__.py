"""Tests against the booted lab."""
