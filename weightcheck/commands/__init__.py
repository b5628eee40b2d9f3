"""CLI commands that live in their own modules (see weightcheck.cli.COMMAND_MODULES)."""
