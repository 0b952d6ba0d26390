"""Subcommands of `prefixgate` that live beside the main entry point (cli.py)."""
