"""``kubectl-lookahead``: the kubectl plugin (``kubectl lookahead VERB ...``).

Verbs are argparse subcommands; each sets ``func(args) -> int``. ``analyze`` is the embedded main
job (``lookahead_operator.cli.analyze``); ``approve``, ``abort``, ``pause``, ``resume``, ``status`` and
``report POLICY`` act on LookaheadPolicy objects through the Kubernetes API
(``lookahead_operator.cli.plugin``): each of their failures is one line on stderr and an exit status
(``lookahead_operator.cli.plugin.EXIT_CODES``: 1 not found, 2 bad input, 3 cannot use the cluster,
4 not allowed), and they take ``--kubeconfig``, ``--context`` and ``--request-timeout``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from lookahead_operator.cli import plugin

    parser = argparse.ArgumentParser(
        prog="kubectl-lookahead",
        description="Measure whether lookahead decoding pays on your model, prompts, hardware and batch sizes.",
        epilog="approve|abort|pause|resume|status|report POLICY [-n NS] [--kubeconfig PATH] [--context NAME]:\n"
               "every failure is one line on stderr; " + plugin.EXIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    from lookahead_operator.cli import analyze

    p = sub.add_parser(
        "analyze", help="start a control and a canary engine locally (or use two running ones), sweep batch "
                        "sizes, decide, and write a report",
        description="Start a control (lookahead off) and a canary (lookahead on) reference engine, drive both at "
                    "each batch size with a closed-loop load generator, compare with anytime-valid statistics, "
                    "print the per-batch table, the crossover and the decision, and write report.html, PNG plots "
                    "and report.json to --out.")
    analyze.add_arguments(p)
    p.set_defaults(func=analyze.main)

    # approve, abort, pause, resume, status, report POLICY: through the Kubernetes API
    plugin.add_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
