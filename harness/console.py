"""The command line's standard streams: ~ in path options, a result that cannot be written, closed streams."""
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
