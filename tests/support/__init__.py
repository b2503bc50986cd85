"""Helpers the tiers share (plain functions and constants; the fixtures are in conftest.py)."""
