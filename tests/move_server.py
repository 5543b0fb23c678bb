"""The moves' tenant server now lives in :mod:`tests.extra_clusters` (east, one of the run's
extra clusters, shared by the xdist workers); these names stay for tests that import them here.
"""

from tests.extra_clusters import TenantServer, second_cluster, tenant_server

__all__ = ["TenantServer", "second_cluster", "tenant_server"]
