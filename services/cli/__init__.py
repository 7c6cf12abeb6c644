"""The `chamber` command line. Each sub-command lives in its own module here with a `register` function
(found at start, so parallel work adds commands without touching this file)."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from services.cli.errors import UsageError

_NOT_COMMANDS = {"__main__", "common", "errors", "tables"}  # __main__ would run the CLI on import


def command_names() -> list[str]:
    """The modules that may hold commands, by name, without importing them."""
    return sorted(i.name for i in pkgutil.iter_modules(__path__) if i.name not in _NOT_COMMANDS)


def command_modules(only: str | None = None) -> list[ModuleType]:
    """Every module in this package with a `register(subparsers)`; a new command is a new module.
    `only`: just the module of that name (a long-running command's process needs no other)."""
    modules = []
    for name in command_names():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"{__name__}.{name}")
        if hasattr(module, "register"):
            modules.append(module)
    return modules


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chamber",
        description="Chamber: make a shared GPU fleet run near its limit.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules(only):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in LONG_RUNNING:
        lighten_logging()
    # A process imports its own service's module at most, not every one's; `chamber service`,
    # `chamber service --help` and `chamber --help` still list them all.
    naming_a_service = argv[:1] == ["service"] and len(argv) >= 2 and not argv[1].startswith("-")
    if naming_a_service or (argv and argv[0] != "service" and not argv[0].startswith("-")):
        from services.cli import service

        service.focus([argv[1]] if naming_a_service else [])
    # A long-running command's process (each service of `chamber up`, the agent, the workload)
    # imports its own command's module only: every other command's imports would stay in memory.
    long_running = argv[:1] and argv[0] in LONG_RUNNING and argv[0] in command_names()
    parser = build_parser(argv[0] if long_running else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    args.command_path = command_path(parser, argv)  # `chamber quota set`: warnings and errors start with it
    from services.runtime.logs import configure_logging

    # Commands print their results on stdout; library chatter (e.g. a connection closing) must not
    # mix into it. Long-running commands raise their own level.
    configure_logging("error", json=False)
    escape = args.command not in LONG_RUNNING
    streams = sys.stdout, sys.stderr
    if escape:  # names, reasons and bodies come from the bus: they must not drive the terminal
        sys.stdout, sys.stderr = EscapingWriter(sys.stdout), EscapingWriter(sys.stderr)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away (`| head`) is not an error of ours
        return code
    except UsageError as exc:
        print(f"{args.command_path}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # a service refusing to start (`raise SystemExit("chamber webhook: ...")`): the same prefix
        message = re.sub(r"^chamber [\w -]+: ", "", exc.code)
        print(f"{args.command_path}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader stopped reading (`chamber queue | head`): stop quietly, as `cat` would. Point stdout
        # at /dev/null so that Python's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), streams[0].fileno())
        return 128 + signal.SIGPIPE
    finally:
        if escape:
            sys.stdout, sys.stderr = streams


def command_path(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """The sub-command words given (`chamber quota pool delete`): the prefix argparse's own errors use,
    so every error of the CLI reads `chamber WORDS: error: ...`."""
    words = ["chamber"]
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            if word.startswith("-") or not subs:
                continue  # an option before the next sub-command, or past the last one
            break
        parser = subs[0].choices[word]
        words.append(word)
    return " ".join(words)


# Optional extras structlog loads when they are installed: rich only to draw tracebacks (the
# services' logs print them plainly; 5 to 6 MB of every service process), greenlet only for
# greenlet-based servers (none here). `chamber up` runs about ten such processes.
_NOT_IN_SERVICES = ("rich", "greenlet")


def lighten_logging() -> None:
    """Before anything imports structlog: its optional extras count as missing (a None in
    sys.modules makes `import rich` raise ImportError, which structlog expects)."""
    for name in _NOT_IN_SERVICES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


# Commands that run for long and print their own logs (colours included): not filtered.
LONG_RUNNING = frozenset({"up", "service", "agent", "workload"})


class EscapingWriter:
    """A text stream that writes control characters (other than newline and tab) escaped: `\\x1b`
    for ESC. A job name or a dead letter's body carrying terminal escapes prints as text.
    JSON output is unchanged (json.dumps already escapes them)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(text.translate(_ESCAPES))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...
        return getattr(self._inner, name)


_ESCAPES = {c: repr(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"}


if __name__ == "__main__":
    sys.exit(main())
