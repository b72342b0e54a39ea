"""Test doubles and hand-built data shared by the test tiers (pure logic only: the tiers
talk to a real Valkey and moto, see tests/conftest.py)."""
