"""Test support: real services for the test suite (PostgreSQL databases, the Tansu broker)."""
