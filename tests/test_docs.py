"""The docs and the committed runs agree: every cited run exists, every committed run is cited, and every
relative link in the docs points at a file. Pure: reads text files and the git index, runs no model."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "reports" / "runs"
# A run id: 20261201-155230-vm (timestamp, host). Trailing '-' or '_' is punctuation, not part of the id.
RUN_ID = re.compile(r"(?<![0-9A-Za-z])\d{8}-\d{6}-[A-Za-z0-9_-]+")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def doc_files() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [ROOT / "README.md", ROOT / "reports" / "README.md", *docs]


def cited_ids(text: str) -> set[str]:
    return {m.group(0).rstrip("-_") for m in RUN_ID.finditer(text)}


def committed_paths() -> list[str] | None:
    """Tracked paths under reports/ (deletions staged with git rm count as gone); None outside a checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--", "reports"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = [p for p in out.splitlines() if p]
    if not paths:
        return None
    return [p for p in paths if (ROOT / p).exists()]


def committed_runs(paths: list[str] | None = None) -> set[str]:
    paths = committed_paths() if paths is None else paths
    if paths is None:  # not a git checkout: every run directory there counts
        return {p.name for p in RUNS.iterdir() if p.is_dir() and not p.is_symlink()} if RUNS.is_dir() else set()
    return {p.split("/")[2] for p in paths if p.startswith("reports/runs/") and p.count("/") >= 3}


def id_exists(run_id: str, paths: list[str] | None) -> bool:
    """A committed run directory, or a committed file whose name holds the id (predict-<run>-<machine>.md)."""
    if paths is None:
        paths = [str(p.relative_to(ROOT)) for p in (ROOT / "reports").rglob("*") if p.is_file()]
    return run_id in committed_runs(paths) or any(run_id in Path(p).name for p in paths)


def _name(f: Path) -> str:
    return str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else f.name


def missing_citations(files: list[Path], paths: list[str] | None) -> list[str]:
    bad = []
    for f in files:
        for run_id in sorted(cited_ids(f.read_text())):
            if not id_exists(run_id, paths):
                bad.append(f"{_name(f)}: {run_id}")
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(files: list[Path], tracked: set[str] | None = None) -> list[str]:
    """Links to no file or heading; with tracked (paths from the repo root), also links to files git doesn't hold,
    which a clean clone lacks."""
    bad = []
    for f in files:
        text = CODE_SPAN.sub("", FENCE.sub("", f.read_text()))
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{_name(f)}: {target} (no such file)")
            elif tracked is not None and dest != f and _name(dest) not in tracked:
                bad.append(f"{_name(f)}: {target} (not committed)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{_name(f)}: {target} (no such heading)")
    return bad


def test_run_id_pattern():
    text = "see `20261201-155230-vm`, reports/20261201-161630-vm.md and predict-20261201-155230-vm-vm-t1.md; 2026-12-01"
    assert cited_ids(text) == {"20261201-155230-vm", "20261201-161630-vm", "20261201-155230-vm-vm-t1"}
    assert cited_ids("run 20261201-155230-vm-.") == {"20261201-155230-vm"}


def test_every_cited_run_exists():
    bad = missing_citations(doc_files(), committed_paths())
    assert not bad, "cited runs that are not committed:\n" + "\n".join(bad)


def test_a_missing_run_is_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("measured in `20991231-235959-nowhere`; see reports/20261201-155230-vm.md.\n")
    assert missing_citations([doc], committed_paths()) == ["x.md: 20991231-235959-nowhere"]


def test_every_committed_run_is_cited():
    runs = committed_runs()
    if not runs:
        pytest.skip("no committed runs here")
    cited = set().union(*(cited_ids(f.read_text()) for f in doc_files()))
    uncited = sorted(runs - cited)
    assert not uncited, ("committed runs cited nowhere in README.md or docs/ (cite them, or git rm -r "
                         "reports/runs/<id> reports/<id>.md):\n" + "\n".join(uncited))


def test_relative_links_resolve():
    bad = broken_links(doc_files())
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_committed_reports_link_only_committed_files():
    """A report rendered beside plots that `harness archive` dropped links them; a clean clone then lacks them,
    and `harness report --check` there disagrees with the committed report."""
    paths = committed_paths()
    if paths is None:
        pytest.skip("not a git checkout")
    reports = [ROOT / p for p in paths if p.count("/") == 1 and p.endswith(".md")]
    bad = broken_links(reports, set(paths))
    assert not bad, "committed reports link what is not committed (run `harness archive` on the run again):\n" + \
        "\n".join(bad)


def test_broken_link_is_caught(tmp_path):
    (tmp_path / "y.md").write_text("# A heading, with `code`\n\n## Again\n\n## Again\n\n## long_context: N = 8\n")
    doc = tmp_path / "x.md"
    doc.write_text("[ok](y.md#a-heading-with-code) [twice](y.md#again-1) [gone](nope.md) [bad](y.md#other)\n"
                   "[under](y.md#long_context-n--8) "
                   "`[in code](z.md)` [web](https://example.com/x.md)\n")
    assert broken_links([doc]) == ["x.md: nope.md (no such file)", "x.md: y.md#other (no such heading)"]
    (tmp_path / "z.md").write_text("# Top\n\n[here](y.md) [self](#top)\n")
    assert broken_links([tmp_path / "z.md"], {"z.md"}) == ["z.md: y.md (not committed)"]
