"""Subcommands of `prefixgate`, registered by the main entry point (cli.py)."""
