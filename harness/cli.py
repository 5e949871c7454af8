"""Command line: parses options and delegates. Errors the user can fix become one line on stderr."""
from __future__ import annotations

import sys

import click
from tabulate import tabulate

from harness.errors import HarnessError


@click.group()
@click.version_option(package_name="harness")
def cli():
    """Speculative-decoding benchmark harness for GGUF models."""


@cli.group()
def models():
    """The model catalog (models.toml)."""


@models.command("list")
def models_list():
    """Name, family, arch, quant, bytes, present, verified."""
    from harness.models.catalog import load_catalog
    from harness.models.manage import list_rows
    click.echo(tabulate(list_rows(load_catalog()), headers="keys", tablefmt="github"))


@models.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every model in the catalog, derived ones included.")
def models_fetch(names, all_):
    """Download (or build) models, verify sha256, rename into the models directory."""
    from harness.models.manage import fetch_models
    for line in fetch_models(list(names), all_):
        click.echo(line)


@models.command("verify")
@click.argument("names", nargs=-1)
def models_verify(names):
    """Recompute sha256 of present models (or the named ones) against the catalog."""
    from harness.models.manage import verify_models
    rows, ok = verify_models(list(names))
    click.echo(tabulate(rows, headers="keys", tablefmt="github"))
    if not ok:
        raise HarnessError("verification failed for at least one model (see the table)")


@models.command("info")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
def models_info(ref, as_json):
    """Arch, layers, vocab, tokenizer, quant and context length of NAME or PATH."""
    from harness.models.manage import info_text
    click.echo(info_text(ref, as_json))


def main():
    try:
        cli.main(prog_name="harness")
    except HarnessError as e:
        click.echo(f"harness: error: {e}", err=True)
        sys.exit(e.exit_code)
