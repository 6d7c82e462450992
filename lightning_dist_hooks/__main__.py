"""``python -m lightning_dist_hooks COMMAND [...]``: the package's command-line tools (``--help`` lists them)."""

from __future__ import annotations

import sys

# Each command: its module (whose ``main(argv)`` runs it) and one line saying what it is for.
COMMANDS = {
    "doctor": (
        "lightning_dist_hooks.doctor",
        (
            "check that a job's ranks can meet and all-reduce, started exactly as the job (also: "
            "lightning-dist-hooks-doctor)"
        ),
    ),
}
USAGE = f"usage: python -m lightning_dist_hooks {{{','.join(COMMANDS)}}} [--help] | --help | --version"


def help_text() -> str:
    """What ``--help`` prints: the usage, then each command with its line."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join([USAGE, "", "commands:", *lines, "", "COMMAND --help shows a command's own options."])


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] in (["--help"], ["-h"]):
        print(help_text())
        return 0
    if arguments[:1] == ["--version"]:
        from lightning_dist_hooks import __version__

        print(f"lightning-dist-hooks {__version__}")
        return 0
    if not arguments or arguments[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    module, _ = COMMANDS[arguments[0]]
    command = __import__(module, fromlist=["main"])
    return int(command.main(arguments[1:]))


if __name__ == "__main__":
    sys.exit(main())
