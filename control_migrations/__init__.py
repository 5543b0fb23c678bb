"""Alembic tree of the control schema (shipped inside the package)."""
