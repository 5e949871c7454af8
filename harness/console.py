"""The command line's standard streams (~ in path options, a result that cannot be written, closed streams) and
the layout of its --help: what a user needs on the first screen, the long tail below a marked heading."""
from __future__ import annotations

import sys

import click

from harness.errors import HarnessError


def home(ctx, param, value):
    """~ in a path option, expanded as the shell does unquoted ('~/x' and --out=~/x reach us as they are)."""
    import os
    if isinstance(value, tuple):
        return tuple(os.path.expanduser(v) for v in value)
    return None if value is None else os.path.expanduser(value)


# Seen at import, before main() puts /dev/null in place of a closed standard stream
STDOUT_CLOSED = sys.stdout is None


def say(text: str) -> None:
    """What a command prints as its result: one that cannot be written (stdout closed, a full disk, a closed pipe)
    is an error, not exit 0 with nothing shown."""
    out = sys.stdout
    try:
        if out is None or STDOUT_CLOSED:
            raise OSError("it is closed")
        out.write(text + "\n")
        out.flush()
    except OSError as e:
        raise HarnessError(f"cannot write the output to standard output ({e.strerror or e}): give the command an "
                           "open, writable standard output") from None


def fill_closed_streams() -> None:
    """A standard stream closed at start (`2>&-`) becomes /dev/null: what would go there is dropped, and no file
    opened later takes its descriptor (llama.cpp's log, written to descriptor 2, would land in it)."""
    import os
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one, as those below are open
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


class Sectioned(click.Command):
    """A command whose --help lists the options named in `first` (in that order, then --help) under "Options" and
    every other one under the heading `rest`, so none is ever left out. Presentation only: parsing is click's."""

    def __init__(self, *args, first: tuple[str, ...] = (), rest: str = "Advanced options", **kw):
        super().__init__(*args, **kw)
        if unknown := set(first) - {p.name for p in self.params}:
            raise ValueError(f"{self.name}: no option named {', '.join(sorted(unknown))} to list first")
        self.first, self.rest = tuple(first), rest

    def format_options(self, ctx, formatter):
        params = {p.name: p for p in self.get_params(ctx) if not isinstance(p, click.Argument)}
        first = [params.pop(name) for name in self.first]
        if (h := self.get_help_option(ctx)) is not None and h.name in params:
            first.append(params.pop(h.name))

        def rows(ps):
            return [r for p in ps if (r := p.get_help_record(ctx)) is not None]
        _sections(formatter, [("Options", rows(first)), (self.rest, rows(params.values()))])


class Grouped(click.Group):
    """A group whose --help lists the commands named in `maintenance` under a heading of their own, below the ones a
    user runs."""

    def __init__(self, *args, maintenance: tuple[str, ...] = (), **kw):
        super().__init__(*args, **kw)
        self.maintenance = tuple(maintenance)

    def format_commands(self, ctx, formatter):
        cmds = {n: c for n in self.list_commands(ctx) if (c := self.get_command(ctx, n)) is not None and not c.hidden}
        limit = formatter.width - 6 - max(map(len, cmds), default=0)
        rows = [(n, c.get_short_help_str(limit), n in self.maintenance) for n, c in cmds.items()]
        _sections(formatter, [("Commands", [(n, h) for n, h, m in rows if not m]),
                              ("Maintenance commands", [(n, h) for n, h, m in rows if m])])


def _sections(formatter, sections) -> None:
    for title, rows in sections:
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


def run_cli(cli: click.Group, args: list[str]) -> None:
    """The command line run on args: an error the user can fix is one line on stderr and an exit code, never a
    traceback."""
    fill_closed_streams()
    try:
        rc = cli.main(args=args, prog_name="harness", standalone_mode=False, obj={"argv": args})
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except HarnessError as e:
        click.echo(f"harness: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.UsageError as e:  # one line, not click's three (usage, hint, error)
        cmd = e.ctx.command_path if e.ctx else "harness"
        click.echo(f"harness: error: {e.format_message()} (see `{cmd} --help`)", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"harness: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort as e:
        from harness.procs import Terminated
        if isinstance(e.__cause__, Terminated):  # SIGTERM, SIGHUP before bench had a run to keep
            click.echo(f"harness: error: stopped by {e.__cause__.name}", err=True)
            sys.exit(128 + e.__cause__.signum)
        click.echo("harness: error: aborted", err=True)
        sys.exit(130)
    except OSError as e:  # a write that failed (full disk, read-only, something in the way): one line for all
        from harness.errors import os_error_line
        line = os_error_line(e)
        if line is None:
            raise
        click.echo(f"harness: error: {line}", err=True)
        sys.exit(1)
