"""`rag-pipeline …`: the operator's commands. Errors end with a one-line message and exit 1/2."""

import sys

import click

from rag_pipeline.cli.common import CliError, Commands, index_url


@click.group(cls=Commands)
def main() -> None:
    """Incremental RAG index: crawler deliveries in, cited search results out."""


def _register() -> None:
    """Each command group lives in a module of its own."""
    from rag_pipeline.cli import (crawl_commands, db_commands, follow_command, search_commands, server_commands,
                                  site_commands, space_commands, status_command)

    for command in (db_commands.db_group, db_commands.prune, server_commands.webhook, server_commands.serve,
                    server_commands.token, search_commands.search, search_commands.ask, status_command.status,
                    space_commands.space, space_commands.backfill, crawl_commands.deliver, crawl_commands.seed,
                    crawl_commands.cadence, site_commands.site, follow_command.follow):
        main.add_command(command)


_register()

__all__ = ["CliError", "Commands", "index_url", "main"]

if __name__ == "__main__":
    sys.exit(main())
