"""`harness drafts` (harness/models/drafts.py): llama.cpp's draft-compatibility rule read from GGUF headers, the
harness's alignment beside it, sizes and ranks, over folders of tiny GGUFs the tests write; the header-derived
vocabulary against llama.cpp's own (vocab-only loads), the rule against llama-server itself (slow tier), and the
real SmolLM2 pair where models/ has it."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tests.helpers import harness, nested_gguf, one_line_error
from tests.tiny_gguf import build_tokenizer, write_tiny_model

from harness.errors import HarnessError
from harness.models import drafts, draftstable, header

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
SMOL, SMOL_Q2 = MODELS / "smollm2-135m-instruct-q4_1.gguf", MODELS / "smollm2-135m-instruct-q2_k.gguf"
GEMMA, QWEN = MODELS / "gemma-3-270m-q4_k_m.gguf", MODELS / "qwen2.5-coder-0.5b-instruct-q4_0.gguf"

TOK = build_tokenizer()
N = TOK.n_vocab
# candidate file stem -> write_tiny_model's arguments (the target: the default tokenizer, a bigger model)
CANDIDATES = {
    "same": {"seed": 1},
    "small": {"seed": 2, "n_layer": 1, "n_embd": 32, "n_ff": 32},  # the same tokenizer, under half the target
    "spm": {"tokenizer_fields": {"model": "llama"}},
    "bos": {"variant": "bos_id"},
    "add_bos": {"variant": "add_bos"},
    "eos_added": {"tokenizer_fields": {"eos_id": N - 1, "add_eos": True}},
    "eos_not_added": {"tokenizer_fields": {"eos_id": N - 1}},
    "pad100": {"variant": "padding", "n_padding": 100},
    "pad200": {"variant": "padding", "n_padding": 200},
    "text4": {"token_texts": {4: "FOUR"}},
    "text5": {"token_texts": {5: "FIVE"}},
}
# llama.cpp's verdict: None (accepted) or words of the failing clause
RULE = {
    "same": None, "small": None, "pad100": None, "text4": None, "eos_not_added": None,
    "spm": "vocab type differs: target BPE, draft SPM",
    "bos": "BOS id differs",
    "add_bos": "add-BOS differs: target true, draft false",
    "eos_added": "add-EOS differs: target false, draft true",
    "pad200": "vocab sizes differ by 200 (llama.cpp allows 128)",
    "text5": "token 5 differs",
}
OLLAMA_BLOB = "sha256-" + "ab" * 32


def _target(d: Path) -> Path:
    return write_tiny_model(d / "target.gguf", n_layer=3)  # 1.3x the default model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """target.gguf beside cands/: the candidates, a non-GGUF .gguf, a truncated header, files that are not
    models, and an Ollama layout whose blob has no suffix."""
    d = tmp_path_factory.mktemp("drafts")
    _target(d)
    c = d / "cands"
    for stem, kw in CANDIDATES.items():
        write_tiny_model(c / f"{stem}.gguf", **kw)
    (c / "junk.gguf").write_bytes(b"not a gguf file at all\n" * 10)
    (c / "README.txt").write_text("not a model")
    (c / "notes").write_text("no suffix, not GGUF")  # looked at (no suffix), left out silently
    trunc = c / "sub" / "truncated.gguf"
    write_tiny_model(trunc, seed=3)
    os.truncate(trunc, 2000)  # inside its key-values
    blobs = c / "ollama" / "blobs"
    write_tiny_model(blobs / OLLAMA_BLOB, seed=4)
    (blobs / ("sha256-" + "cd" * 32)).write_text('{"stop": ["<|im_end|>"]}')  # a params blob
    man = c / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "tinyllama" / "latest"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32},
        {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "cd" * 32}]}))
    return d


@pytest.fixture(scope="module")
def headers_only(folder) -> dict:
    """The survey with no alignment check (headers only), by candidate name."""
    s = drafts.survey(folder / "target.gguf", "target", [folder / "cands"])
    return s | {"by": {c["name"]: c for c in s["candidates"]}}


# -- llama.cpp's rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stem", sorted(RULE))
def test_llama_cpp_rule(headers_only, stem):
    got = headers_only["by"][stem]["llama_cpp"]
    if RULE[stem] is None:
        assert got == {"ok": True, "clause": None}
    else:
        assert not got["ok"] and RULE[stem] in got["clause"], got


def test_failing_clauses_in_words(headers_only):
    by = headers_only["by"]
    assert by["bos"]["llama_cpp"]["clause"] == f"BOS id differs: target {TOK.bos_id}, draft {TOK.eos_id}"
    assert by["text5"]["llama_cpp"]["clause"].endswith("draft 'FIVE'")


def test_token_texts_from_id_5_up_only():
    """Ids 0-4 are never compared (SPEC_VOCAB_CHECK_START_TOKEN_ID); a NUL ends a text, as strcmp reads it."""
    def v(texts):
        return header.Vocab("BPE", "gpt2", "x", len(texts), header.NULL, header.NULL, False, False, texts)
    base = [b"t%d" % i for i in range(10)]
    assert drafts.llama_cpp_rule(v(base), v([b"other"] * 5 + base[5:])) is None
    assert drafts.llama_cpp_rule(v(base), v(base[:7] + [b"t7\0tail"] + base[8:])) is None
    assert drafts.llama_cpp_rule(v(base), v(base[:7])) is None  # up to the smaller vocabulary
    assert drafts.llama_cpp_rule(v(base), v(base[:9] + [b"x"])) == "token 9 differs: target 't9', draft 'x'"


def test_vocab_defaults_follow_llama_vocab_cpp(tmp_path):
    """Keys a header leaves out take llama.cpp's defaults for the vocab type and pre-tokenizer."""
    def vocab_of(**kv):
        h = header.Header(tmp_path, 1, {"tokenizer.ggml.model": "gpt2", **kv}, [b"x%d" % i for i in range(300)], "")
        return header.vocab(h)
    v = vocab_of()
    assert (v.type, v.bos, v.eos, v.add_bos, v.add_eos) == ("BPE", 11, 11, False, False)
    assert vocab_of(**{"tokenizer.ggml.pre": "llama-bpe"}).add_bos is True
    assert vocab_of(**{"tokenizer.ggml.pre": "glm4"}).bos == header.NULL
    assert vocab_of(**{"tokenizer.ggml.bos_token_id": 999}).bos == 11  # out of range: the default stays
    spm = vocab_of(**{"tokenizer.ggml.model": "llama"})
    assert (spm.type, spm.bos, spm.eos, spm.add_bos, spm.add_eos) == ("SPM", 1, 2, True, False)
    t5 = vocab_of(**{"tokenizer.ggml.model": "t5", "tokenizer.ggml.add_eos_token": False})
    assert (t5.type, t5.bos, t5.eos, t5.add_bos, t5.add_eos) == ("UGM", header.NULL, 1, False, False)
    assert vocab_of(**{"tokenizer.ggml.model": "gemma4"}).type == "BPE"
    with pytest.raises(header.Unreadable, match="tokenizer 'wordsoup'"):
        vocab_of(**{"tokenizer.ggml.model": "wordsoup"})


# -- files found, files skipped ------------------------------------------------------------------------------
def test_skipped_with_a_count_not_fatal(headers_only):
    kinds = {Path(k["path"]).name: k["kind"] for k in headers_only["skipped"]}
    assert kinds == {"junk.gguf": "not GGUF", "truncated.gguf": "truncated"}
    text = draftstable.format_survey(headers_only)
    assert "skipped 1 not GGUF, 1 truncated" in text


def test_what_is_found(headers_only):
    names = set(headers_only["by"])
    assert names == set(CANDIDATES) | {"tinyllama:latest"}, names  # not the target, README, notes, params blob
    blob = headers_only["by"]["tinyllama:latest"]
    assert blob["path"].endswith(OLLAMA_BLOB) and blob["llama_cpp"]["ok"]


def test_ollama_blob_without_a_manifest_is_named_from_its_header(tmp_path):
    write_tiny_model(tmp_path / "blobs" / OLLAMA_BLOB, seed=4, name="Tiny Blob")
    s = drafts.survey(_target(tmp_path), "target", [tmp_path / "blobs"])
    assert [c["name"] for c in s["candidates"]] == [f"Tiny Blob ({OLLAMA_BLOB[:19]})"]


def test_links_and_split_models(tmp_path):
    """A file reached twice is one candidate; a split model is its first part, sized with all its parts."""
    t = _target(tmp_path)
    d = tmp_path / "c"
    a = write_tiny_model(d / "one.gguf", seed=1)
    (d / "again").mkdir()
    (d / "again" / "one-link.gguf").symlink_to(a)
    (d / "loop").symlink_to(d)  # a folder loop is walked once
    p1 = write_tiny_model(d / "big-00001-of-00002.gguf", seed=2)
    shutil.copy(p1, d / "big-00002-of-00002.gguf")
    write_tiny_model(d / "half-00001-of-00002.gguf", seed=3)
    s = drafts.survey(t, "target", [d])
    by = {c["name"]: c for c in s["candidates"]}
    assert set(by) == {"one", "big"}, set(by)
    assert by["big"]["bytes"] == 2 * p1.stat().st_size
    assert [k["kind"] for k in s["skipped"]] == ["split part missing"]


def test_truncated_tensor_data_is_skipped(tmp_path):
    t = _target(tmp_path)
    cut = write_tiny_model(tmp_path / "c" / "cut.gguf", seed=1)
    os.truncate(cut, cut.stat().st_size - 1000)
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert s["candidates"] == []
    assert s["skipped"][0]["kind"] == "truncated" and "tensors need" in s["skipped"][0]["why"]


def test_headers_only_a_100_gb_file_answers_at_once(tmp_path):
    """A sparse 100 GB GGUF: only its header is read (reading its data would take minutes)."""
    t = _target(tmp_path)
    big = write_tiny_model(tmp_path / "c" / "huge.gguf", seed=1)
    os.truncate(big, 100 * 10**9)
    t0 = time.perf_counter()
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert time.perf_counter() - t0 < 5
    (c,) = s["candidates"]
    assert c["bytes"] == 100 * 10**9 and c["llama_cpp"]["ok"] and not c["plausibly_faster"]


# -- size, rank, advice --------------------------------------------------------------------------------------
def test_sizes_and_ranks(headers_only):
    by = headers_only["by"]
    assert by["small"]["plausibly_faster"] and by["small"]["size_ratio"] <= 0.5
    assert not by["same"]["plausibly_faster"]
    ranked = [c for c in headers_only["candidates"] if c["rank"] is not None]
    assert [c["rank"] for c in ranked] == list(range(1, len(ranked) + 1))
    assert ranked[0]["name"] == "small"  # compatible, aligned and small enough
    assert all(c["llama_cpp"]["ok"] for c in ranked)  # no alignment check here: llama.cpp's rule ranks alone
    assert {c["name"] for c in headers_only["candidates"] if c["rank"] is None} == {
        k for k, v in RULE.items() if v is not None}


def test_the_harness_alignment_from_headers(headers_only):
    by = headers_only["by"]
    assert by["same"]["harness"] == {"ok": True, "verdict": "ALIGNED", "how": "header",
                                     "why": "the same tokenizer metadata as the target"}
    assert by["spm"]["harness"]["verdict"] == "MISALIGNED" and "tokenizer model" in by["spm"]["harness"]["why"]
    assert by["text4"]["harness"]["verdict"] == "MISALIGNED"  # llama.cpp's rule passes it, the harness's does not
    assert by["text4"]["harness"]["why"].startswith("token 4 differs")
    assert by["pad100"]["harness"] == {"ok": False, "verdict": None, "why": "not checked", "how": "none"}


def test_advice_names_the_best_draft(headers_only, folder):
    a = headers_only["advice"]
    small = folder / "cands" / "small.gguf"  # not in the catalog: named by its path, as bench takes it
    assert a.startswith("Try small:") and f"--target {folder / 'target.gguf'} --draft {small},ngram:3" in a
    assert f"--spec-type draft-simple --spec-draft-model {small}" in a


def test_advice_without_a_compatible_draft(tmp_path):
    t = _target(tmp_path)
    write_tiny_model(tmp_path / "c" / "other.gguf", variant="other_tokenizer")
    write_tiny_model(tmp_path / "c" / "bigger.gguf", n_layer=6, n_ff=256)  # compatible, not smaller
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert "No compatible GGUF here is at most 0.5x" in s["advice"]
    (other,) = [c for c in s["candidates"] if c["name"] == "other"]
    os.remove(tmp_path / "c" / "bigger.gguf")
    s = drafts.survey(t, "target", [tmp_path / "c"])
    a = s["advice"]
    assert a.startswith("No GGUF here can draft for target")
    for words in ("--draft ngram:3", "ngram-simple", "ngram-mod", "tiny-llama-default-s0 (architecture llama)"):
        assert words in a, a
    assert other["rank"] is None


# -- the command -----------------------------------------------------------------------------------------------
def test_command_table_and_json(folder):
    r = harness("drafts", folder / "target.gguf", folder / "cands")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Target target: ")
    assert "| rank" in r.stdout and "| 1      | small" in r.stdout
    assert "vocab sizes differ by 200 (llama.cpp allows 128)" in r.stdout
    assert lines[-1].startswith("Try small")
    j = harness("drafts", folder / "target.gguf", folder / "cands", "--json")
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert data["target"]["vocab"]["n_tokens"] == N
    assert {c["name"] for c in data["candidates"]} >= set(CANDIDATES)


def test_default_folders(folder, tmp_path):
    """No PATH: models/ and the usual places under the home folder, where they exist."""
    home = tmp_path / "home"
    lm = home / ".lmstudio" / "models" / "pub" / "repo"
    lm.mkdir(parents=True)
    shutil.copy(folder / "cands" / "small.gguf", lm / "lm.gguf")
    blobs = home / ".ollama" / "models" / "blobs"
    blobs.mkdir(parents=True)
    shutil.copy(folder / "cands" / "same.gguf", blobs / OLLAMA_BLOB)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(folder / "cands" / "pad100.gguf", models / "m.gguf")
    env = {"HOME": str(home), "HARNESS_MODELS_DIR": str(models), "XDG_CACHE_HOME": "", "LLAMA_CACHE": "",
           "HF_HOME": "", "HF_HUB_CACHE": "", "OLLAMA_MODELS": ""}
    r = harness("drafts", folder / "target.gguf", "--json", env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["roots"] == [str(models), str(home / ".lmstudio" / "models"), str(blobs)]
    assert {Path(c["path"]).name for c in data["candidates"]} == {"lm.gguf", OLLAMA_BLOB, "m.gguf"}


@pytest.mark.parametrize("case", ["missing", "not_gguf", "truncated", "no_vocab", "bad_path"])
def test_bad_input_is_one_line(tmp_path, folder, case):
    t = folder / "target.gguf"
    args = {
        "missing": [tmp_path / "nope.gguf", folder / "cands"],
        "not_gguf": [folder / "cands" / "junk.gguf", folder / "cands"],
        "truncated": [folder / "cands" / "sub" / "truncated.gguf", folder / "cands"],
        "no_vocab": [tmp_path / "proj.gguf", folder / "cands"],
        "bad_path": [t, tmp_path / "no-such-folder"],
    }[case]
    if case == "no_vocab":
        import gguf
        w = gguf.GGUFWriter(str(args[0]), "clip")
        w.add_type("mmproj")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    r = harness("drafts", *args)
    words = {"missing": ["does not exist"], "not_gguf": ["not a GGUF file"], "truncated": ["truncated header"],
             "no_vocab": ["no vocabulary"], "bad_path": ["no such file or folder"]}[case]
    one_line_error(r, *words)


def test_unknown_target_name():
    one_line_error(harness("drafts", "no-such-model-anywhere"), "unknown model")


def test_read_header_raises_only_unreadable(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF")
    with pytest.raises(header.Unreadable) as e:
        header.read_header(p)
    assert e.value.kind == "truncated"
    p.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(header.Unreadable, match="GGUF version 1"):
        header.read_header(p)
    with pytest.raises(HarnessError, match="target"):
        drafts.survey(p, "x", [])
    p.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16))
    with pytest.raises(header.Unreadable, match="big-endian"):
        header.read_header(p)


def test_a_header_that_claims_more_than_the_file_holds(tmp_path):
    """Counts are checked against the bytes left, so a damaged header over a sparse file fails at once."""
    import struct
    p = tmp_path / "x.gguf"
    key = b"tokenizer.ggml.tokens"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                  + struct.pack("<IIQ", 9, 8, 2**40))
    os.truncate(p, 10**9)  # a gigabyte of zeros: each a string of length 0, were the count believed
    t0 = time.perf_counter()
    with pytest.raises(header.Unreadable, match="truncated header"):
        header.read_header(p)
    assert time.perf_counter() - t0 < 1


# -- with llama.cpp ----------------------------------------------------------------------------------------------
@pytest.mark.model
def test_the_harness_alignment_check(folder):
    """Where the headers leave it open, the harness's own check (vocab-only loads) decides."""
    pytest.importorskip("llama_cpp")
    from harness.align import check_pair
    calls = []

    def align(t, d):
        calls.append(Path(d).name)
        return check_pair(t, d)
    s = drafts.survey(folder / "target.gguf", "target", [folder / "cands"], align=align)
    by = {c["name"]: c for c in s["candidates"]}
    assert by["pad100"]["harness"]["verdict"] == "ALIGNED WITH WARNINGS" and by["pad100"]["harness"]["how"] == "check"
    assert by["bos"]["harness"]["verdict"] == "MISALIGNED" and "BOS" in by["bos"]["harness"]["why"]
    assert by["eos_not_added"]["harness"]["verdict"] == "MISALIGNED"  # llama.cpp's rule lets it through
    assert by["same"]["harness"]["how"] == "header" and by["small"]["harness"]["how"] == "header"
    assert "same.gguf" not in calls and "spm.gguf" not in calls and "text5.gguf" not in calls
    assert len(calls) == len(set(calls)) <= 6, calls
    assert s["candidates"][0]["name"] == "small"


@pytest.mark.model
@pytest.mark.parametrize("stem", ["same", "spm", "bos", "add_bos", "eos_added", "eos_not_added", "pad100", "text5"])
def test_header_vocab_is_llama_cpps(folder, stem):
    """What the header reading derives (vocab type, BOS/EOS ids, add flags, size, texts) is what llama.cpp loads."""
    pytest.importorskip("llama_cpp")
    from harness.llamacpp import Vocab, llama, load_model
    p = folder / "cands" / f"{stem}.gguf"
    mine = header.vocab(header.read_header(p))
    model = load_model(p, n_gpu_layers=0, vocab_only=True)
    try:
        v = Vocab(model)
        ll = v._ll
        sp = v.specials()
        assert (mine.bos, mine.eos, mine.add_bos, mine.add_eos) == (sp["bos"], sp["eos"], sp["add_bos"],
                                                                   sp["add_eos"])
        assert mine.n_tokens == v.n_vocab
        assert ll.llama_vocab_type(v.vocab) == ["NONE", "SPM", "BPE", "WPM", "UGM", "RWKV", "PLAMO2"].index(mine.type)
        assert mine.texts == [ll.llama_vocab_get_text(v.vocab, i) for i in range(v.n_vocab)]
    finally:
        llama().llama_model_free(model)


@pytest.mark.model
@pytest.mark.skipif(not (SMOL.exists() and SMOL_Q2.exists()), reason="SmolLM2 Q4_1 and Q2_K not in models/")
def test_real_smollm2_pair():
    """SmolLM2 Q4_1: its Q2_K is compatible (and aligned); Gemma 3 and Qwen2.5-Coder are not."""
    pytest.importorskip("llama_cpp")
    from harness.align import check_pair
    s = drafts.survey(SMOL, "smollm2-135m-instruct-q4_1", [MODELS], align=check_pair)
    by = {Path(c["path"]).name: c for c in s["candidates"]}
    q2 = by[SMOL_Q2.name]
    assert q2["llama_cpp"]["ok"] and q2["harness"]["ok"] and q2["rank"] == 1
    assert not q2["plausibly_faster"]  # 0.9x the target's bytes
    if GEMMA.exists():
        assert by[GEMMA.name]["llama_cpp"]["clause"] == "vocab type differs: target BPE, draft SPM"
        assert by[GEMMA.name]["rank"] is None
    if QWEN.exists():
        assert by[QWEN.name]["llama_cpp"]["clause"].startswith("vocab sizes differ by 102784")
        assert not by[QWEN.name]["harness"]["ok"] and by[QWEN.name]["rank"] is None
    assert "No compatible GGUF here is at most 0.5x" in s["advice"] and "smollm2" in s["advice"]


# -- against llama-server itself (slow tier) ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_accepts(server: Path, target: Path, draft: Path, log: Path) -> bool:
    """Whether llama-server sets up speculation with this draft: it logs that the vocabs are not compatible and
    serves without it otherwise."""
    with open(log, "w") as out:
        p = subprocess.Popen([str(server), "-m", str(target), "--spec-type", "draft-simple", "--spec-draft-model",
                              str(draft), "--port", str(_free_port()), "-t", "1", "-c", "256"],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and "listening on" not in log.read_text():
            time.sleep(0.1)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    text = log.read_text()
    assert "listening on" in text, text[-2000:]
    return "vocabs are not compatible" not in text


@pytest.mark.slow
@pytest.mark.model
def test_the_rule_agrees_with_llama_server(folder, tmp_path):
    """The port against the real thing: `make native`'s llama-server, each candidate as its draft."""
    from harness.crosscheck.binary import native_candidates
    server = next((p for p in native_candidates() if os.access(p, os.X_OK)), None)
    if server is None:
        pytest.skip("no llama-server built by `make native`")
    t = folder / "target.gguf"
    tv = header.vocab(header.read_header(t))
    for stem in sorted(RULE):
        d = folder / "cands" / f"{stem}.gguf"
        ours = drafts.llama_cpp_rule(tv, header.vocab(header.read_header(d))) is None
        assert _server_accepts(server, t, d, tmp_path / f"{stem}.log") == ours, stem


# -- issue 57: files that are not what they seem, folders that cannot be read --------------------------------------
def _unreadable(monkeypatch, mod, path: Path) -> None:
    """os.scandir in `mod` refuses `path` as a folder without read permission does (root ignores modes)."""
    real = os.scandir

    def scandir(p="."):
        if Path(p) == path:
            raise PermissionError(13, "Permission denied", str(p))
        return real(p)
    monkeypatch.setattr(mod.os, "scandir", scandir)


def test_a_fifo_without_a_suffix_in_a_scanned_folder_is_passed_over(tmp_path):  # case 108
    from tests.helpers import within
    t = _target(tmp_path)
    write_tiny_model(tmp_path / "c" / "one.gguf", seed=1)
    os.mkfifo(tmp_path / "c" / "blob")  # no suffix: sniffed for GGUF's magic only when it is a regular file
    os.mkfifo(tmp_path / "c" / "pipe.gguf")
    with within(20):
        s = drafts.survey(t, "target", [tmp_path / "c"])
    assert [c["name"] for c in s["candidates"]] == ["one"]


def test_nested_arrays_are_a_refusal_of_that_file(tmp_path):  # case 115
    t = _target(tmp_path)
    write_tiny_model(tmp_path / "c" / "one.gguf", seed=1)
    nested_gguf(tmp_path / "c" / "deep.gguf")
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert [c["name"] for c in s["candidates"]] == ["one"]
    (k,) = s["skipped"]
    assert k["kind"] == "unreadable" and "arrays nested more than 16 deep" in k["why"]
    one_line_error(harness("drafts", tmp_path / "c" / "deep.gguf", tmp_path / "c"), "deep.gguf",
                   "arrays nested more than 16 deep")


def _no_tensors(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[8:16] = (0).to_bytes(8, "little")  # n_tensors
    p.write_bytes(bytes(b))


def _no_architecture(p: Path) -> None:
    p.write_bytes(p.read_bytes().replace(b"general.architecture", b"general.architecturX", 1))


UNLOADABLE = {"96-no-tensors": (_no_tensors, "no tensors (a vocabulary-only GGUF)"),
              "96-no-architecture": (_no_architecture, "no general.architecture key")}


@pytest.mark.parametrize("spoil, why", list(UNLOADABLE.values()), ids=list(UNLOADABLE))
def test_a_gguf_llama_cpp_cannot_load_is_skipped_not_ranked(tmp_path, spoil, why):  # case 96
    t = _target(tmp_path)
    write_tiny_model(tmp_path / "c" / "one.gguf", seed=1)
    spoil(write_tiny_model(tmp_path / "c" / "bad.gguf", seed=2))
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert [c["name"] for c in s["candidates"]] == ["one"]
    (k,) = s["skipped"]
    assert k["kind"] == "not a model" and why in k["why"], k
    spoil(t)
    one_line_error(harness("drafts", t, tmp_path / "c"), f"target {t}", why)


def test_a_folder_that_cannot_be_read_is_said(tmp_path, monkeypatch):  # case 101
    t = _target(tmp_path)
    write_tiny_model(tmp_path / "c" / "sub" / "one.gguf", seed=1)
    _unreadable(monkeypatch, draftstable, tmp_path / "c")
    one_line_error(harness("drafts", t, tmp_path / "c"), f"{tmp_path / 'c'}: cannot read the folder",
                   "Permission denied", "check its permissions")
    monkeypatch.undo()
    _unreadable(monkeypatch, drafts, tmp_path / "c" / "sub")  # below a folder given: skipped, and counted
    s = drafts.survey(t, "target", [tmp_path / "c"])
    assert s["candidates"] == [] and [k["kind"] for k in s["skipped"]] == ["unreadable folder"]
    assert "skipped 1 unreadable folder" in draftstable.format_survey(s)


def test_an_unreadable_target_is_a_read_error_not_a_write_one(tmp_path, monkeypatch):  # case 102
    from harness.models import catalog
    t = _target(tmp_path)

    def denied(p, *a, **kw):
        raise PermissionError(13, "Permission denied", str(p))
    monkeypatch.setattr(catalog, "open", denied, raising=False)
    line = one_line_error(harness("drafts", t, tmp_path), f"cannot read model file {t}", "check its permissions")
    assert "--out" not in line and "write" not in line


def test_a_target_with_a_plus_in_its_name_gets_advice_bench_takes(tmp_path):  # cases 112, 113
    from harness.bench.prepare import models_info
    from harness.plan import make_params
    t = write_tiny_model(tmp_path / "t+1.gguf", n_layer=3)
    small = write_tiny_model(tmp_path / "c" / "c++-draft.gguf", seed=2, n_layer=1, n_embd=32, n_ff=32)
    a = drafts.survey(t, "t+1", [tmp_path / "c"])["advice"]
    assert f"--target {t} --draft {small},ngram:3" in a, a
    p = make_params({}, {"target": str(t), "draft": f"{small},ngram:3"})  # bench's reading of the advised command
    assert [d.model for d in p.draft] == [str(small), None]
    info = models_info({str(small)}, targets={str(t)})
    assert info[str(t)]["bytes"] == t.stat().st_size and info[str(small)]["bytes"] == small.stat().st_size
