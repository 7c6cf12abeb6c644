class UsageError(Exception):
    """A mistake the user can fix; printed as one line naming the field and the fix, no traceback."""
