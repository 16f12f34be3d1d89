"""The command line's one error style and help format, shared by ``xstage`` and ``xstage reproduce``.

Every error is one line on stderr, ``<prog>: error: <what, in the words the user typed> (see <prog> --help)``,
exit code 2; every option's help ends with its default.
"""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (``xstage sweep burst-gap: error: ...``), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default (comma-separated for lists), unless it says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (not action.option_strings or "%(default)" in text or "default" in text or d is argparse.SUPPRESS
                or d is None or d is False or (isinstance(d, (tuple, list)) and not d)):
            return text
        shown = ",".join(map(str, d)) if isinstance(d, (tuple, list)) else str(d)
        return f"{text} (default: {shown.replace('%', '%%')})"


def error_line(prog: str, message: str) -> int:
    """Print the one error line of ``prog`` (``xstage``, ``xstage reproduce``, ...) on stderr; exit status 2."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2
