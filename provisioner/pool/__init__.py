"""The warm pool: spare tenant schemas built ahead of demand, taken by a rename.

* :mod:`provisioner.pool.spares`: what a spare is, its statements, its take and its drop;
* :mod:`provisioner.pool.build`: a spare's build, its replay in batches and its record;
* :mod:`provisioner.pool.grants`: the application roles' grants a spare carries, and the checks
  the build and the take make of them;
* :mod:`provisioner.pool.keeper`: the worker's keeper thread, which refills the pool while
  idle;
* :mod:`provisioner.pool.refill`: a refill, one pass under the builders' lock (one keeper
  building per database), its spares built side by side;
* :mod:`provisioner.pool.server_spares`: the spares on each tenant server, and their take
  there (claimed on control, renamed on the server).
"""

from __future__ import annotations

from provisioner.errors import BuildStopped, SpareRejected
from provisioner.pool.build import BATCH, build_spare
from provisioner.pool.grants import (
    GRANTS_HELD,
    GrantsHeld,
    check_spare_grants,
    grant_usage_if_in_place,
    grants_held,
    spare_grant_batches,
    usage_held,
)
from provisioner.pool.keeper import Dropped, PoolKeeper, drop_stale_spare
from provisioner.pool.refill import (
    POOL_LOCK_CLASS,
    RELEASE_BUILD_LOCK,
    TRY_BUILD_LOCK,
    Tended,
    builder_lock,
    drop_unfinished,
    refill,
)
from provisioner.pool.server_schemas import OnServer
from provisioner.pool.server_spares import (
    active_servers,
    finish_take,
    server_counts,
    take_on_server,
    takes_for,
)
from provisioner.pool.spares import (
    ADD_SPARE,
    CLAIM_STALE_SPARE,
    COUNT_SPARES,
    FOREIGN_SCHEMAS,
    FORGET_SPARE_SCHEMA,
    SPARE_PREFIX,
    TAKE_PLANS,
    TAKE_SPARE,
    UNFINISHED_SPARES,
    WARM_TOUCHES,
    PoolCounts,
    Taken,
    counts,
    drop_schema,
    foreign_schemas,
    plan_take,
    rename_spare,
    roles_key,
    take,
)

__all__ = [
    "ADD_SPARE",
    "BATCH",
    "CLAIM_STALE_SPARE",
    "COUNT_SPARES",
    "FOREIGN_SCHEMAS",
    "FORGET_SPARE_SCHEMA",
    "GRANTS_HELD",
    "POOL_LOCK_CLASS",
    "RELEASE_BUILD_LOCK",
    "SPARE_PREFIX",
    "TAKE_PLANS",
    "TAKE_SPARE",
    "TRY_BUILD_LOCK",
    "UNFINISHED_SPARES",
    "WARM_TOUCHES",
    "BuildStopped",
    "Dropped",
    "GrantsHeld",
    "OnServer",
    "PoolCounts",
    "PoolKeeper",
    "SpareRejected",
    "Taken",
    "Tended",
    "active_servers",
    "build_spare",
    "builder_lock",
    "check_spare_grants",
    "counts",
    "drop_schema",
    "drop_stale_spare",
    "drop_unfinished",
    "finish_take",
    "foreign_schemas",
    "grant_usage_if_in_place",
    "grants_held",
    "plan_take",
    "refill",
    "rename_spare",
    "roles_key",
    "server_counts",
    "spare_grant_batches",
    "take",
    "take_on_server",
    "takes_for",
    "usage_held",
]
