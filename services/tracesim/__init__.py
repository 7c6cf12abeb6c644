"""Trace-driven simulation: replay a job trace on a virtual clock under a scheduling policy.

The `chamber` policy drives the scheduler's own pure core (evolve / schedule / events_for), the same
code the live service runs; the baselines are a plain FIFO cluster and hard per-team partitions.
"""
