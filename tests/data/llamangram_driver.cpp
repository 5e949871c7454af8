// tests/test_llamangram.py's slow test: llama.cpp's own common_speculative_* API (the calls llama-server makes) for
// its model-free n-gram types, driven along given plain greedy outputs, no model. Input (stdin): "type flag=N ...",
// then per request "n_predict eos_token", a prompt line, an output line (the target's greedy choice at each output
// position, extended past the end with tokens that never match). Output per request: "drafted accepted steps".
#include "common.h"
#include "speculative.h"
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static std::vector<int> read_line_ints() {
    std::string line;
    std::getline(std::cin, line);
    std::istringstream ss(line);
    std::vector<int> v; int x;
    while (ss >> x) v.push_back(x);
    return v;
}

int main() {
    std::string line;
    std::getline(std::cin, line);
    std::istringstream ss(line);
    std::string type; ss >> type;
    common_params_speculative params;
    params.types = common_speculative_types_from_names({type});
    std::string kv;
    while (ss >> kv) {
        auto eq = kv.find('='); std::string k = kv.substr(0, eq); int v = std::stoi(kv.substr(eq + 1));
        auto & m = type == "ngram-simple" ? params.ngram_simple : type == "ngram-map-k" ? params.ngram_map_k : params.ngram_map_k4v;
        if (k == "n-match") params.ngram_mod.n_match = v;
        else if (k == "n-max") params.ngram_mod.n_max = v;
        else if (k == "n-min") params.ngram_mod.n_min = v;
        else if (k == "size-n") m.size_n = v;
        else if (k == "size-m") m.size_m = v;
        else if (k == "min-hits") m.min_hits = v;
    }
    common_speculative * spec = common_speculative_init(params, 1);
    while (true) {
        auto head = read_line_ints();
        if (head.size() < 2) break;
        int n_predict = head[0], eos = head[1];
        auto prompt = read_line_ints();
        auto out = read_line_ints();
        common_speculative_begin(spec, 0, prompt);
        llama_tokens cache = prompt;
        int sampled = out[0], n_gen = 1, pos = 1;
        long drafted = 0, accepted = 0, steps = 0;
        bool stop = sampled == eos || n_gen >= n_predict;
        while (!stop) {
            int n_draft_max = n_predict - n_gen - 1;
            llama_tokens draft;
            if (n_draft_max > 0) {
                llama_tokens spec_prompt = cache;
                common_speculative_get_draft_params(spec, 0) = {true, n_draft_max, (llama_pos) cache.size(), sampled, &spec_prompt, &draft};
                common_speculative_draft(spec);
            }
            size_t k = 0;
            while (k < draft.size() && draft[k] == out[pos + k]) k++;
            llama_tokens ids(draft.begin(), draft.begin() + k);
            ids.push_back(out[pos + k]);
            if (!draft.empty()) {
                common_speculative_accept(spec, 0, k);
                drafted += draft.size(); accepted += k; steps++;
            }
            cache.push_back(sampled);
            cache.insert(cache.end(), draft.begin(), draft.begin() + k);
            for (int t : ids) {
                n_gen++;
                if (t == eos || n_gen >= n_predict) { stop = true; break; }
            }
            sampled = ids.back();
            pos += k + 1;
        }
        printf("%ld %ld %ld\n", drafted, accepted, steps);
        fflush(stdout);
    }
    common_speculative_free(spec);
    return 0;
}
