"""Alembic tree applied inside one tenant schema (shipped inside the package)."""
