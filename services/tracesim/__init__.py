"""Trace-driven simulation: replay a job trace on a virtual clock under a scheduling policy.

Every policy (`chamber`, and the baselines `fifo` and `static-quota`) drives the scheduler's own pure
core (evolve / schedule / events_for), the same code the live service runs, with its `Policy`.
"""
