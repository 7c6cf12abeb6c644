"""The command line's errors; `UsageError` lives in services/errors.py so services need not import the CLI."""

from services.errors import UsageError  # noqa: F401 (the CLI's name for it; services import services.errors)
