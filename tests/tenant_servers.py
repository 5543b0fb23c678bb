"""The fan-out tests' two tenant servers now live in :mod:`tests.extra_clusters` (the run's
extra clusters, shared by the xdist workers); these names stay for tests that import them here.
"""

from tests.extra_clusters import FleetServer as TenantServer
from tests.extra_clusters import clusters, place, register, tenant_servers

__all__ = ["TenantServer", "clusters", "place", "register", "tenant_servers"]
