"""harness.specs: the types only llama-server runs here (ServerType: the drafting heads), ngram-cache (ported, a
LlamaNgram with no flags) and llama-server's comma lists of types (Combined, written with '+'), parsed, written back
and refused in one line; the plan keeps them to --engine server. Every spec refused in one line is here; the n-gram
types' readings: test_llamangram."""
import pytest

from harness.errors import HarnessError
from harness.plan import expand, make_params
from harness.specs import Combined, DraftModel, LlamaNgram, ServerType, parse_draft, split_plus
from tests.conftest import T

MOD = "ngram-mod:n-match=4:n-max=8:n-min=2"


@pytest.mark.parametrize("text, spec", [
    ("draft-mtp", ServerType("draft-mtp")),
    ("draft-mtp:/m/mtp.gguf", ServerType("draft-mtp", "/m/mtp.gguf")),
    ("draft-eagle3:/m/e3.gguf", ServerType("draft-eagle3", "/m/e3.gguf")),
    ("draft-dflash:/m/df.gguf", ServerType("draft-dflash", "/m/df.gguf")),
])
def test_server_types_read_and_write_back(text, spec):
    d = parse_draft(text)
    assert d == spec and str(d) == text and parse_draft(str(d)) == d
    assert d.server_only and d.server_type == text.split(":")[0]
    assert (d.model_free, d.own_gamma) == (False, None)
    assert d.model is None  # a head is not a draft model the harness loads, aligns or probes


def test_ngram_cache_is_ported_a_llama_ngram_with_no_flags():
    d = parse_draft("ngram-cache")
    assert d == LlamaNgram.make("ngram-cache") and str(d) == "ngram-cache" and parse_draft(str(d)) == d
    assert not d.server_only and d.server_type == "ngram-cache" and d.values == {}
    assert (d.model_free, d.own_gamma, d.model, d.ngram) == (True, 8, None, None)


def test_a_combination_takes_llama_cpps_order_of_preference():
    d = parse_draft(f"/m/d.gguf+{MOD}+ngram-simple:size-n=3:size-m=4")
    assert isinstance(d, Combined) and d.server_only
    assert [p.server_type for p in d.parts] == ["ngram-simple", "ngram-mod", "draft-simple"]
    assert str(d) == f"ngram-simple:size-n=3:size-m=4+{MOD}+/m/d.gguf" and parse_draft(str(d)) == d
    assert d.server_type == "ngram-simple,ngram-mod,draft-simple"
    # the draft model's settings apply (its model is aligned and probed); the gamma is the sweep's, and the
    # longest draft a step verifies is the longest any part drafts
    assert d.model == "/m/d.gguf" and not d.model_free and d.own_gamma is None
    assert d.longest(3) == 8 and d.longest(12) == 12
    free = parse_draft(f"{MOD}+ngram-cache")
    assert free.model is None and free.model_free and free.own_gamma == 8
    assert free.parts == (LlamaNgram.make("ngram-mod", n_match=4, n_max=8, n_min=2), LlamaNgram.make("ngram-cache"))
    assert free.server_type == "ngram-mod,ngram-cache" and free.server_only and parse_draft(str(free)) == free
    assert parse_draft("draft-mtp+ngram-mod").parts == (LlamaNgram.make("ngram-mod"), ServerType("draft-mtp"))


def test_the_existing_kinds_name_their_llama_server_type():
    assert [parse_draft(t).server_type for t in ("none", "ngram:3", "d.gguf", MOD)] == \
        ["none", None, "draft-simple", "ngram-mod"]
    assert not any(parse_draft(t).server_only for t in ("none", "ngram:3", "d.gguf", MOD))
    assert parse_draft("d.gguf") == DraftModel("d.gguf")
    assert parse_draft("draft-model") == DraftModel("draft-model")  # a catalog name, not one of llama.cpp's types


@pytest.mark.parametrize("text, words", [
    ("draft-eagle3", ["draft-eagle3:PATH.gguf"]),
    ("draft-dflash", ["draft-dflash:PATH.gguf"]),
    ("draft-dspark", ["no type draft-dspark", "draft-mtp, draft-eagle3, draft-dflash"]),
    ("draft-simple", ["a draft model by name or path for draft-simple"]),
    ("ngram-cache:n=2", ["ngram-cache takes no flags"]),
    ("ngram-cache:n", ["ngram-cache takes no flags"]),
    ("ngram:3+ngram-mod", ["ngram:3 cannot be part of a combination"]),
    ("none+ngram-mod", ["none cannot be part"]),
    ("ngram-mod+ngram-mod:n-max=8", ["each llama.cpp type once"]),
    ("d.gguf+draft-mtp", ["one draft context"]),
    ("a.gguf+b.gguf", ["one draft model at most"]),
    # issue 57: an empty part named with its combination (26, 27); two models joined are one model too many (28)
    ("ngram-mod+", ["--draft ngram-mod+:", "an empty part"]),
    ("+ngram-mod", ["--draft +ngram-mod:", "an empty part"]),
    ("smollm2-a+smollm2-b", ["one draft model at most"]),
    ("ngram-foo", ["no n-gram type ngram-foo", "ngram:N"]),
    ("ngram-mod:size-n=3", ["ngram-mod has no flag size-n", "n-match, n-max, n-min"]),
    ("ngram-mod:n-max=0", ["never drafts"]),
    ("ngram-mod:n-max=2000", ["n-max", "from 0 to 1024"]),
    ("ngram-simple:size-n=0", ["size-n", "from 1 to 1024"]),
    ("ngram-mod:n-max=x", ["must be an integer"]),
    ("ngram-mod:n-max", ["flag=N"]),
    ("ngram-mod:n-max=4:n_max=5", ["once each"]),
    ("n-min=4", ["':', not ','"]),  # what a comma list leaves of ngram-mod:n-max=16,n-min=4
])
def test_a_bad_spec_is_refused_in_one_line(text, words):
    with pytest.raises(HarnessError) as e:
        parse_draft(text)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("draft", ["draft-mtp", f"{MOD}+ngram-simple", "ngram-cache+ngram-mod"])
def test_the_harness_loop_refuses_what_only_llama_server_runs(draft):
    with pytest.raises(HarnessError, match="--draft .*measured in llama-server only: add --engine server"):
        make_params({}, {"target": T, "draft": draft})


def test_under_engine_server_a_head_takes_the_sweeps_gamma_and_ngram_cache_its_own(fake):
    p = make_params({}, {"target": T, "draft": "none,draft-mtp,ngram-cache", "gamma": "2,4", "engine": "server",
                         "llama_server": str(fake)})
    got = sorted((str(i.draft), i.gamma) for i in expand(p) if not i.baseline)
    assert got == [("draft-mtp", 2), ("draft-mtp", 4), ("ngram-cache", 8)]


def test_the_harness_loop_runs_ngram_cache_at_its_own_8():
    p = make_params({}, {"target": T, "draft": "none,ngram-cache", "gamma": "2,4"})
    assert [(str(i.draft), i.gamma) for i in expand(p) if not i.baseline] == [("ngram-cache", 8)]
    with pytest.raises(HarnessError, match="ngram-cache is not served to several requests yet"):
        make_params({}, {"target": T, "draft": "ngram-cache", "parallel": "2"})


# issue 57 (cases 58, 61): a '+' in a model's path is its name's, not a combination's; only what is not a path
# splits at '+'
@pytest.mark.parametrize("text, parts", [
    ("c++-draft.gguf", ["c++-draft.gguf"]),
    ("/m/smol+q2.gguf", ["/m/smol+q2.gguf"]),
    ("ngram-mod+/m/c++-draft.gguf", ["ngram-mod", "/m/c++-draft.gguf"]),
    ("/m/c++-draft.gguf+ngram-mod:n-max=8", ["/m/c++-draft.gguf", "ngram-mod:n-max=8"]),
    ("draft-eagle3:/m/e3+x.gguf+ngram-cache", ["draft-eagle3:/m/e3+x.gguf", "ngram-cache"]),
    ("a.gguf+b.gguf", ["a.gguf", "b.gguf"]),
    ("ngram-mod+ngram-cache", ["ngram-mod", "ngram-cache"]),
])
def test_a_plus_inside_a_path_is_the_paths(text, parts):
    assert split_plus(text) == parts


def test_a_file_on_disk_with_a_plus_and_no_suffix_is_one_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smol+q2").write_bytes(b"GGUF")
    assert parse_draft("smol+q2") == DraftModel("smol+q2")
    assert split_plus("ngram-mod+smol+q2") == ["ngram-mod", "smol+q2"]
    d = parse_draft("smol+q2+ngram-mod")
    assert isinstance(d, Combined) and d.model == "smol+q2" and parse_draft(str(d)) == d
    assert parse_draft("c++-draft.gguf") == DraftModel("c++-draft.gguf")
