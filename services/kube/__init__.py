"""Kubernetes workloads as Chamber sees them, shared by the scheduler's actuator and the admission
webhook: which kinds exist and how each is held, placed, suspended and read (`kinds`), how many GPUs
a pod asks for (`resources`), and which teams a namespace may charge (`bindings`). All pure; the
only I/O is in `cluster` (the adapter over the real `kubernetes` client)."""
