"""harness.howto: the llama.cpp commands for a configuration, checked against llama.cpp's own parser."""
import re
import shlex
from pathlib import Path

import pytest

from harness.models.catalog import Model
from harness.instance import Instance
from harness.howto import howto, model_path
from harness.sampling import Policy
from harness.specs import parse_draft

# Produced by `python tests/test_howto.py vendor/llama.cpp/common/arg.cpp > tests/data/llama_cpp_0.3.36_flags.txt`
# on the llama-cpp-python 0.3.36 sdist: one flag per line, a tab, then the tools that accept it (arg.cpp's
# set_examples, "common" for every tool, "-tool" for set_excludes) or "removed" (arg_removed).
FLAGS_FILE = Path(__file__).parent / "data" / "llama_cpp_0.3.36_flags.txt"

GREEDY = Policy()
SAMPLED = Policy(0.7, 0, 0.9, 0.0, 0)
CATALOG = {"tgt": Model("tgt", "path", source_path=Path("/models/t 1.5b.gguf")),
           "dft": Model("dft", "path", source_path=Path("/models/d.gguf"))}

def cmd(draft: str, gamma: int, policy: Policy, n_ctx: int = 2048, **knobs):
    """howto() for a configuration of target "tgt" with these settings (instance.Instance's names)."""
    inst = Instance("tgt", parse_draft(draft), gamma, policy, knobs.pop("ngl", 0), knobs.pop("ngl_draft", 0),
                    knobs.pop("threads", 0), **knobs)
    return howto(inst, n_ctx, catalog=CATALOG)


# every flag howto can emit, by tool
EMITTED = {"server": ["-m", "-ngl", "-c", "-np", "-kvu", "-t", "-ctk", "-ctv", "-fa", "-ub", "--temp", "--top-k",
                      "--top-p", "--min-p", "-s", "--spec-type", "--spec-draft-model", "--spec-draft-n-max",
                      "--spec-draft-p-min", "--spec-draft-n-min", "--spec-draft-ngl", "--spec-draft-threads",
                      "--spec-draft-type-k", "--spec-draft-type-v", "--spec-ngram-simple-size-n",
                      "--spec-ngram-simple-size-m"],
           "speculative": ["-m", "-ngl", "-c", "-t", "-ctk", "-ctv", "-fa", "-ub", "--temp", "--top-k", "--top-p",
                           "--min-p", "-s", "--spec-type", "--spec-draft-model", "--spec-draft-n-max",
                           "--spec-draft-p-min", "--spec-draft-n-min", "--spec-draft-ngl", "--spec-draft-threads",
                           "--spec-draft-type-k", "--spec-draft-type-v", "-p"]}


def flags_from_arg_cpp(text: str) -> dict[str, set[str]]:
    """Every add_opt(common_arg({...names...}, ...)) of arg.cpp: flag -> the tools that accept it."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    lists = dict(re.findall(r"initializer_list<enum llama_example>\s+(\w+)\s*=\s*(\{[^}]*\})", text))

    def tools(m, prefix=""):
        src = m.group(1) if m.group(1).startswith("{") else lists[m.group(1)]
        return {prefix + t.lower() for t in re.findall(r"LLAMA_EXAMPLE_(\w+)", src)}

    out: dict[str, set[str]] = {}
    for chunk in text.split("add_opt(common_arg(")[1:]:
        head = re.match(r"\s*((?:\{[^{}]*\}\s*,\s*)+)", chunk)
        body = chunk.split("add_opt(", 1)[0]
        ex = re.search(r"set_examples\((\{[^}]*\}|\w+)\)", body)
        tags = tools(ex) if ex else {"common"}
        if exc := re.search(r"set_excludes\((\{[^}]*\}|\w+)\)", body):
            tags |= tools(exc, "-")
        if "arg_removed(" in body:
            tags = {"removed"}
        for name in re.findall(r'"(-[^"]+)"', head.group(1)):
            out.setdefault(name, set()).update(tags)
    return out


def known_flags() -> dict[str, set[str]]:
    return {f: set(t.split(",")) for f, _, t in (line.partition("\t") for line in FLAGS_FILE.read_text().splitlines())}


def flags_of(cmd: str) -> list[str]:
    return [w for w in shlex.split(cmd) if re.match(r"^-[-a-z]", w)]


def test_draft_model_greedy_with_p_min_n_min_kv_and_offload():
    h = cmd("dft", 4, GREEDY, p_min=0.75, n_min=2, ngl=99, ngl_draft=20, threads=4, cache_k_draft="q8_0",
            cache_v_draft="q8_0", cache_k="q8_0", flash_attn="on", ubatch=256, n_ctx=4096)
    ctx = "-m '/models/t 1.5b.gguf' -ngl 99 -c 4096 -t 4 -ctk q8_0 -fa on -ub 256"
    spec = ("--spec-type draft-simple --spec-draft-model /models/d.gguf --spec-draft-n-max 4 --spec-draft-p-min 0.75 "
            "--spec-draft-n-min 2 --spec-draft-ngl 20 --spec-draft-threads 4 --spec-draft-type-k q8_0 "
            "--spec-draft-type-v q8_0")
    assert h.server == f"llama-server {ctx} -np 1 {spec} --temp 0"
    assert h.speculative_simple == f'llama-speculative-simple {ctx} {spec} --temp 0 -p "$PROMPT"'
    assert h.python is None
    assert h.note == ""  # greedy: both rules are one


def test_draft_model_sampled_defaults_and_the_rule_note():
    h = cmd("dft", 3, SAMPLED)
    tail = ("--spec-type draft-simple --spec-draft-model /models/d.gguf --spec-draft-n-max 3 --spec-draft-p-min 0 "
            "--spec-draft-ngl 0 --temp 0.7 --top-k 0 --top-p 0.9 --min-p 0 -s 0")
    assert h.server == f"llama-server -m '/models/t 1.5b.gguf' -ngl 0 -c 2048 -np 1 {tail}"
    assert h.speculative_simple == (f"llama-speculative-simple -m '/models/t 1.5b.gguf' -ngl 0 -c 2048 {tail} "
                                    '-p "$PROMPT"')
    assert "Leviathan" in h.note and '"exact"' in h.note
    assert cmd("dft", 3, SAMPLED, verify="exact").note == ""


def test_ngram_proposer():
    h = cmd("ngram:3", 2, SAMPLED, threads=2)
    assert h.server == ("llama-server -m '/models/t 1.5b.gguf' -ngl 0 -c 2048 -t 2 -np 1 --spec-type ngram-simple "
                        "--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 2 --temp 0.7 --top-k 0 --top-p 0.9 "
                        "--min-p 0 -s 0")
    assert h.speculative_simple is None
    assert h.python == (
        "from llama_cpp import Llama\n"
        "from llama_cpp.llama_speculative import LlamaPromptLookupDecoding\n\n"
        "# flash attention: Llama() takes on or off only (default off); the harness ran llama.cpp's auto\n"
        "llm = Llama(model_path='/models/t 1.5b.gguf', n_ctx=2048, n_gpu_layers=0, n_threads=2, n_threads_batch=2, "
        "draft_model=LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=2))\n"
        "out = llm.create_completion(PROMPT, max_tokens=None, temperature=0.7, top_k=0, top_p=0.9, min_p=0.0, seed=0)")
    compile(h.python, "howto", "exec")
    assert "Leviathan" not in h.note  # a lookup's point mass is accepted alike under both rules


def test_python_kv_types_and_flash_attention():
    py = cmd("ngram:2", 4, GREEDY, cache_k="q8_0", cache_v="bf16", flash_attn="off").python
    assert "flash_attn=False, type_k=8, type_v=30, draft_model=" in py and "temperature=0.0)" in py
    assert "# flash" not in py


def test_instance_unresolved_names_and_notes():
    inst = Instance("not-in-catalog", parse_draft("dft"), 6, SAMPLED, 0, 0, 0, adaptive=True, verify="exact",
                    parallel=2)
    h = howto(inst, 1024, catalog=CATALOG)
    assert h.server.startswith("llama-server -m not-in-catalog -ngl 0 -c 1024 -np 2 --spec-type draft-simple "
                               "--spec-draft-model /models/d.gguf --spec-draft-n-max 6 ")
    assert "adaptive" in h.note and "-np 2" in h.note
    assert model_path("nowhere.gguf", {}) == "nowhere.gguf"
    plain = howto(inst.plain(), 1024, catalog=CATALOG)
    assert plain.speculative_simple is None and "--spec" not in plain.server


def test_every_flag_is_llama_cpps():
    known = known_flags()
    for tool, flags in EMITTED.items():
        for f in flags:
            tags = known.get(f, set())
            assert tags & {"common", tool} and f"-{tool}" not in tags, (tool, f, tags)
    cases = [cmd("dft", 4, SAMPLED, p_min=0.5, n_min=1, ngl=1, ngl_draft=1, threads=2, cache_k="q8_0",
                   cache_v="q8_0", cache_k_draft="q4_0", cache_v_draft="q8_0", flash_attn="on", ubatch=128,
                   parallel=2, kv_unified=True),
             cmd("ngram:3", 2, GREEDY), cmd("none", 0, GREEDY)]
    for h in cases:
        assert set(flags_of(h.server)) <= set(EMITTED["server"])
        assert set(flags_of(h.speculative_simple or "")) <= set(EMITTED["speculative"])
    assert set(flags_of(cases[0].server)) == set(EMITTED["server"]) - {"--spec-ngram-simple-size-n",
                                                                         "--spec-ngram-simple-size-m"}
    assert set(flags_of(cases[0].speculative_simple)) == set(EMITTED["speculative"])


def test_fixture_parser():
    src = '''
    add_opt(common_arg(
        // a comment
        {"-x", "--ex"}, "N", "help", [](common_params & params, int v) {}
    ).set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg({"-p"}, "P", "prompt", [](common_params &) {}).set_excludes({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg({"--draft"}, "N", "gone", [](common_params &) { arg_removed("use --spec"); }));
    '''
    assert flags_from_arg_cpp(src) == {"-x": {"server"}, "--ex": {"server"}, "-p": {"common", "-server"},
                                       "--draft": {"removed"}}


@pytest.mark.parametrize("flag", ["--draft-max", "--draft-min"])
def test_removed_flags_are_marked(flag):
    assert known_flags()[flag] == {"removed"}


if __name__ == "__main__":
    import sys
    found = flags_from_arg_cpp(Path(sys.argv[1]).read_text())
    print("\n".join(f"{f}\t{','.join(sorted(t))}" for f, t in sorted(found.items())))


@pytest.mark.parametrize("draft, gamma, flags", [
    ("draft-mtp", 3, "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0 --spec-draft-ngl 0"),
    ("draft-eagle3:/m/e3.gguf", 4, "--spec-type draft-eagle3 --spec-draft-model /m/e3.gguf --spec-draft-n-max 4 "
                                   "--spec-draft-p-min 0 --spec-draft-ngl 0"),
    ("dft+ngram-mod:n-match=4:n-max=8:n-min=2", 3,
     "--spec-type ngram-mod,draft-simple --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-max 8 "
     "--spec-ngram-mod-n-min 2 --spec-draft-model /models/d.gguf --spec-draft-n-max 3 --spec-draft-p-min 0 "
     "--spec-draft-ngl 0"),
    ("ngram-cache+ngram-mod:n-match=4:n-max=8:n-min=2", 8,
     "--spec-type ngram-mod,ngram-cache --spec-ngram-mod-n-match 4 --spec-ngram-mod-n-max 8 --spec-ngram-mod-n-min 2"),
])
def test_types_only_llama_server_runs_get_its_comma_list_and_each_types_flags(draft, gamma, flags):
    h = cmd(draft, gamma, GREEDY)
    assert h.server == f"llama-server -m '/models/t 1.5b.gguf' -ngl 0 -c 2048 -np 1 {flags} --temp 0"
    assert h.speculative_simple is None and h.python is None
    known = known_flags()
    assert all(known.get(f, set()) & {"common", "server"} for f in flags_of(h.server)), h.server
    assert ("first of these types" in h.note) == ("+" in draft)


def test_ngram_cache_takes_no_flags_and_keeps_its_state_from_request_to_request():
    h = cmd("ngram-cache", 8, GREEDY)
    assert h.server == "llama-server -m '/models/t 1.5b.gguf' -ngl 0 -c 2048 -np 1 --spec-type ngram-cache --temp 0"
    assert h.speculative_simple is None and h.python is None
    assert "keeps ngram-cache's state from request to request" in h.note
