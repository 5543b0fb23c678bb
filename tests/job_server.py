"""The server jobs' tenant server now lives in :mod:`tests.extra_clusters` (east, one of the
run's extra clusters, shared by the xdist workers); these names stay for tests that import them
here."""

from tests.extra_clusters import TenantServerDb, jobs_cluster, jobs_server

__all__ = ["TenantServerDb", "jobs_cluster", "jobs_server"]
