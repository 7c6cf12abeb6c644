"""The scheduler: fair-share queueing, borrowing, preemption with automatic resume, placement."""
