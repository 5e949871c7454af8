class HarnessError(Exception):
    """A problem the user can fix: printed as one line on stderr, no traceback."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# An OSError on a write is the user's to fix (a full disk, a read-only or foreign directory, a file or directory
# in the way): main() turns every one into one line through os_error_line(), so no writer needs its own try.
WRITE_ADVICE = {
    "ENOSPC": "free some space or choose another {opt}",
    "EDQUOT": "free some space or choose another {opt}",
    "EFBIG": "free some space or choose another {opt}",
    "EROFS": "choose a writable {opt}",
    "EACCES": "choose a writable {opt}",
    "EPERM": "choose a writable {opt}",
    "EEXIST": "a file is in the way: remove it or choose another {opt}",
    "ENOTDIR": "a file is in the way: remove it or choose another {opt}",
    "EISDIR": "a directory is in the way: remove it or choose another {opt}",
}


def os_error_line(e: OSError) -> str | None:
    """The one-line message for an OSError a write raised; None for one that is not a write's to report."""
    import errno
    from pathlib import Path
    name = errno.errorcode.get(e.errno or 0, "")
    if name not in WRITE_ADVICE:
        return None
    path = e.filename
    where = f" {path}" if path is not None else ""
    advice = WRITE_ADVICE[name].format(opt=getattr(e, "harness_option", None) or "--out")
    msg = f"cannot write{where}: {e.strerror or e}; {advice}"
    run = getattr(e, "harness_run", None)
    if run is None and path is not None:  # inside a run directory: what finished is kept there
        run = next((d for d in Path(str(path)).parents if (d / "plan.json").is_file()), None)
    if run is not None:
        msg += f" (the results already in {run} are kept: `harness report {run}` writes its report again)"
    return msg


class naming:
    """`with naming(path):` gives an OSError raised inside (a write to an open file carries no file name) the
    path it was writing, the option that chose it (default --out) and the run directory whose results it was
    reporting, for os_error_line()."""

    def __init__(self, path, option: str | None = None, run=None):
        self.path, self.option, self.run = path, option, run

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if isinstance(e, OSError) and e.filename is None and self.path is not None:
            e.filename = str(self.path)
        if isinstance(e, OSError) and self.option and not hasattr(e, "harness_option"):
            e.harness_option = self.option
        if isinstance(e, OSError) and self.run is not None and not hasattr(e, "harness_run"):
            e.harness_run = self.run
        return False


def check_out_dir(path) -> None:
    """Before any work: refuse an output directory that a file is in the way of (itself or a parent), as the
    OSError mkdir would raise once the work is done (main() makes it one line)."""
    import errno
    import os
    from pathlib import Path
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                code = errno.EEXIST if p == path else errno.ENOTDIR
                raise OSError(code, os.strerror(code), str(path))
            return
