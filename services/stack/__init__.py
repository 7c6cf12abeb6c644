"""`chamber up`: running the whole stack on one machine as supervised processes."""
