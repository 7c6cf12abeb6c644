"""`chamber quota import-kueue FILE`: Kueue ClusterQueues, LocalQueues, cohorts, ResourceFlavors and
WorkloadPriorityClasses converted into quota commands and namespace bindings (services.kube.kueue_import).

Standard output is a shell script (the quota commands; the bindings follow as comments, ready for
Helm values); what has no equivalent goes to standard error with the reason (`... error: not
converted: ...`), and the exit status is 1 if anything was refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from services.cli.errors import UsageError


def register(quota_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = quota_sub.add_parser("import-kueue", help="convert Kueue queues (YAML) into quota commands and bindings")
    s.add_argument("file", metavar="FILE", help="Kueue objects, several YAML documents ('-': standard input)")
    s.add_argument("--values-out", metavar="FILE", help="also write the namespace bindings as Helm values here")
    s.set_defaults(func=import_kueue)


def _read(name: str) -> list[object]:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {exc}") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{name} is not YAML: {exc}") from None


def import_kueue(args: argparse.Namespace) -> int:
    from services.kube.kueue_import import convert

    docs = _read(args.file)
    if not docs:
        raise UsageError(f"{args.file} holds no Kueue objects")
    result = convert(docs)
    print(f"# Chamber quota commands converted from {args.file}")
    for command in result.commands:
        print(command)
    if result.bindings:
        values = yaml.safe_dump({"kube": {"bindings": result.bindings}}, sort_keys=True)
        print("# namespace bindings and priority classes, as Helm values (helm upgrade ... -f FILE):")
        for line in values.splitlines():
            print(f"#   {line}")
        if args.values_out:
            Path(args.values_out).write_text(values)
    for reason in result.refused:
        print(f"chamber quota import-kueue: error: not converted: {reason}", file=sys.stderr)
    return 1 if result.refused else 0
