"""Errors shared by services and the command line (services never import the CLI)."""


class UsageError(Exception):
    """A mistake the user can fix; printed as one line naming the field and the fix, no traceback."""
