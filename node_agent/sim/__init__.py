"""The simulated fleet: many nodes in one process, seeded and deterministic, and the job executor."""
