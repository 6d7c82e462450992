"""``python -m lightning_dist_hooks doctor [...]``: the package's command-line tools."""

import sys


def main() -> int:
    commands = {"doctor": "lightning_dist_hooks.doctor"}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python -m lightning_dist_hooks {{{','.join(commands)}}} [--help]", file=sys.stderr)
        return 2
    from lightning_dist_hooks.doctor import main as doctor

    return doctor(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
