"""Pool membership lives in `services/pools.py`, shared by the scheduler, quota and billing cores."""

from services.pools import DEFAULT_POOL, PoolDef, Quota, job_pool, node_pool

__all__ = ["DEFAULT_POOL", "PoolDef", "Quota", "job_pool", "node_pool"]
