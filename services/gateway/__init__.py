"""HTTP API, dashboard and Prometheus metrics over a read model folded from every stream."""
