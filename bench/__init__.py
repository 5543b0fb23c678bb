"""Benchmarks of tenant provisioning against the raw-SQL limit: ``python -m bench``.

Not tests: nothing here asserts a time. See docs/PERFORMANCE.md for how to read the table.
"""
