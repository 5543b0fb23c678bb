"""The ``none`` store: a project that keeps no object storage per tenant.

Step 5 (``verify_object_storage``) keeps its place in the contract's six steps; with this store
it checks nothing and its record says so, rather than pretending a check passed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoStore:
    """No object store configured (``OBJECT_STORE_PROVIDER=none``)."""

    provider: str = "none"

    def describe(self) -> str:
        return "no object store configured (OBJECT_STORE_PROVIDER=none): nothing checked"

    def check(self) -> None:
        return None
