#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    from completions_site.threads import apply_thread_policy

    apply_thread_policy()  # before torch is imported (completions_site/threads.py)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "completions_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
