"""The quota service: pools, team quotas and decayed fair share."""
