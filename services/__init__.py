"""Chamber's services, the runtime they share, and the `chamber` command line."""
