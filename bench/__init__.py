"""Benchmarks of tenant provisioning against the raw-SQL limit: ``python -m bench``.

Not tests: nothing here asserts a time. docs/performance.md says how to read the table.
"""
