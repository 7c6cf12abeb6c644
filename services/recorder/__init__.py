"""The recorder: every stream into the warehouse, batched, acked only after storing, exactly once."""
