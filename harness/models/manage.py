"""What `harness models ...` does: list, fetch, verify, info."""
from __future__ import annotations

import json

from harness.errors import HarnessError
from harness.models import fetch as fetch_mod
from harness.models.catalog import Model, load_catalog, require_present, resolve
from harness.models.meta import read_info
from harness.models.store import read_sidecar, recorded_sha


def cached_info(m: Model) -> dict:
    """GGUF metadata, cached in the sidecar so listing does not re-read big files."""
    side = read_sidecar(m.path)
    if recorded_sha(m.path) and "info" in side:
        return side["info"]
    info = read_info(m.path)
    if side:
        from harness.models.store import write_sidecar
        write_sidecar(m.path, info=info)
    return info


def list_rows(catalog: dict[str, Model]) -> list[dict]:
    rows = []
    for m in catalog.values():
        present = m.path.exists()
        sha = recorded_sha(m.path) if present else None
        expected = m.sha256 or (read_sidecar(m.path).get("built_sha256") if present else None)
        info = cached_info(m) if present and sha else {}
        rows.append({
            "name": m.name,
            "family": m.family,
            "arch": info.get("arch", ""),
            "quant": m.quant + (" (requantized)" if m.requantized else ""),
            "bytes": m.bytes or (m.path.stat().st_size if present else ""),
            "present": "yes" if present else "no",
            "verified": ("yes" if sha and (expected is None or sha == expected) else "NO") if sha
            else ("not yet" if present else ""),
        })
    return rows


def fetch_models(names: list[str], all_: bool) -> list[str]:
    cat = load_catalog()
    if not names and not all_:
        raise HarnessError("name the models to fetch, or pass --all (see `harness models list`)")
    targets = list(cat.values()) if all_ else [resolve(n, cat) for n in names]
    return [f"{m.name}: {fetch_mod.fetch(m, cat)}" for m in targets]


def verify_models(names: list[str]) -> tuple[list[dict], bool]:
    cat = load_catalog()
    targets = [resolve(n, cat) for n in names] if names else [m for m in cat.values() if m.path.exists()]
    rows, all_ok = [], True
    for m in targets:
        try:
            ok, detail = fetch_mod.verify(m)
        except HarnessError as e:  # a damaged file is a failed row, not the end of the listing
            ok, detail = False, str(e)
        all_ok &= ok
        rows.append({"name": m.name, "ok": "yes" if ok else "NO", "detail": detail})
    return rows, all_ok


def info_text(ref: str, as_json: bool) -> str:
    m = resolve(ref)
    require_present(m)
    info = read_info(m.path)
    side = read_sidecar(m.path)
    if side.get("derived_from"):
        info["derived_from"] = side["derived_from"]
        info["note"] = side.get("note", "")
    if as_json:
        return json.dumps(info, indent=1)
    return "\n".join(f"{k:>18}: {v}" for k, v in info.items())
