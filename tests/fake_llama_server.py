"""A stand-in for llama.cpp's llama-server in the crosscheck tests: `--version`, then GET /health and POST
/completion on 127.0.0.1 with canned timings. It is started the way crosscheck starts the real one (through a
wrapper script the test writes, given as --llama-server), and told what to do by the environment:

- FAKE_SERVER_MODE: ok (default); exit (print an error, exit 3 at once); silent (never answers /health);
  notimings (answers /completion without timings); hang (answers /health, never a request); badarg (arg.cpp's
  error line, then usage text, exit 1); assert (a GGML_ASSERT, then gdb's lines, exit 134).
- FAKE_SERVER_TOKENS: a JSON value that replaces every response's token ids (a list of strings, a string).
- FAKE_SERVER_SAYS: a line a speculative server prints as it starts (a complaint about its draft, say).
- FAKE_SERVER_PLAIN_DRAFTS: a plain server (--spec-type none) reports this many drafted tokens, as one that
  something outside its command turned speculative would.
- FAKE_SERVER_SPEEDUP: the speculative server's speedup before the per-prompt factor (default 1.5).
- FAKE_SERVER_LOG: a file to which each request appends a JSON line (role, argv, the request's body).
- FAKE_SERVER_TIMINGS: a JSON object whose fields replace those of every response's timings (a server that
  reports what is no measurement).
- FAKE_SERVER_DRAFTS: none makes a speculating server draft nothing (draft_n 0 on every request, at 0.99x of
  plain), as an n-gram type does on text that never repeats.
- FAKE_SERVER_COUNTER and FAKE_SERVER_LIMIT: requests counted across servers in that file; the one past the limit
  kills the server before it answers (a server that dies mid-run).
- FAKE_SERVER_LACKS: a comma list of flags that `--help` leaves out of llama.cpp 0.3.36's (tests/data's list),
  as an older build would.
- FAKE_SERVER_DIVERGE: a speculating server's output token ids differ from the plain one's from this position.
- --spec-synth-len L (synthetic acceptance): the speculative server runs at 0.6 + 0.4 (L - 1) times plain, times
  factor(n_prompt), and accepts (L - 1) / 3 of its 12 drafted tokens (a longest draft of 3).
- --spec-type with a name llama.cpp lacks: one error line, exit 1 before listening (as arg.cpp's parser).
  FAKE_SERVER_NO_TYPES: a comma list of type names this build lacks too, as an older build would.
- FAKE_SERVER_DEVICES: a comma list of GPU devices `--list-devices` names (default none: a CPU build).

Timings: plain predicted_ms = (n - 1) * (2 + n_prompt % 7); the speculative server's rate is the plain one's times
speedup * factor(n_prompt), factor = 1 + 0.02 * (n_prompt % 5 - 2), so each prompt's pair has a known ratio.
Drafts: draft_n = 10 + n_prompt % 3, draft_n_accepted = 6 + n_prompt % 2, per request. A server speculates as
llama.cpp's does: only where --spec-type names a type other than none (a draft model alone, -md, drafts nothing),
and a plain one reports no draft fields."""
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

ARGV = sys.argv[1:]
TYPES = [t for k, a in enumerate(ARGV[:-1]) if a == "--spec-type" for t in ARGV[k + 1].split(",")]
SPEC = bool(TYPES) and "none" not in TYPES
KNOWN_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
               "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}  # common/speculative.cpp's names
KNOWN_TYPES -= set(os.environ.get("FAKE_SERVER_NO_TYPES", "").split(","))  # an older build's
SYNTH = float(ARGV[ARGV.index("--spec-synth-len") + 1]) if "--spec-synth-len" in ARGV else None
STARTED = time.monotonic()


def factor(n_prompt: int) -> float:
    return 1 + 0.02 * (n_prompt % 5 - 2)


def timings(n_prompt: int, n: int) -> dict:
    plain_ms = (n - 1) * (2 + n_prompt % 7)
    t = {"prompt_n": n_prompt, "prompt_ms": 1.0, "predicted_n": n}
    if not SPEC:
        return t | {"predicted_ms": float(plain_ms)}
    if os.environ.get("FAKE_SERVER_DRAFTS") == "none":
        return t | {"predicted_ms": plain_ms / 0.99, "draft_n": 0, "draft_n_accepted": 0}
    if SYNTH is not None:
        return t | {"predicted_ms": plain_ms / ((0.6 + 0.4 * (SYNTH - 1)) * factor(n_prompt)), "draft_n": 12,
                    "draft_n_accepted": round(12 * (SYNTH - 1) / 3)}
    speedup = float(os.environ.get("FAKE_SERVER_SPEEDUP", "1.5")) * factor(n_prompt)
    return t | {"predicted_ms": plain_ms / speedup, "draft_n": 10 + n_prompt % 3, "draft_n_accepted": 6 + n_prompt % 2}


def reported(n_prompt: int, n: int) -> dict:
    t = timings(n_prompt, n)
    if not SPEC and os.environ.get("FAKE_SERVER_PLAIN_DRAFTS"):
        t |= {"draft_n": int(os.environ["FAKE_SERVER_PLAIN_DRAFTS"]), "draft_n_accepted": 0}
    return t | json.loads(os.environ.get("FAKE_SERVER_TIMINGS", "{}"))


def count() -> None:
    path, limit = os.environ.get("FAKE_SERVER_COUNTER"), os.environ.get("FAKE_SERVER_LIMIT")
    if not path:
        return
    n = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    if limit and n > int(limit):
        print("fake: GGML_ASSERT failed, aborting", file=sys.stderr, flush=True)
        os._exit(134)


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/health":
            return self._send(404, {"error": {"message": "not found"}})
        if time.monotonic() - STARTED < 0.3:
            return self._send(503, {"error": {"message": "Loading model"}})
        self._send(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if os.environ.get("FAKE_SERVER_LOG"):
            with open(os.environ["FAKE_SERVER_LOG"], "a") as f:
                f.write(json.dumps({"role": "speculative" if SPEC else "plain", "argv": ARGV, "body": body}) + "\n")
        count()
        n_prompt, n = len(body["prompt"]), body["n_predict"]
        tokens = list(range(n))
        if SPEC and os.environ.get("FAKE_SERVER_DIVERGE"):
            at = int(os.environ["FAKE_SERVER_DIVERGE"])
            tokens = tokens[:at] + [t + 1000 for t in tokens[at:]]
        t = reported(n_prompt, n)
        if t.get("draft_n"):  # as llama-server's print_timing logs it, at 3 verification steps a request
            a, g = t["draft_n_accepted"], t["draft_n"]
            print(f"slot print_timing: id  0 | task 0 | draft acceptance = {a / g:.5f} ({a:5d} accepted / {g:5d} "
                  f"generated), mean len = {1 + a / 3:5.2f}", file=sys.stderr, flush=True)
        if "FAKE_SERVER_TOKENS" in os.environ:
            tokens = json.loads(os.environ["FAKE_SERVER_TOKENS"])
        if os.environ.get("FAKE_SERVER_MODE") == "hang":
            time.sleep(600)
        if os.environ.get("FAKE_SERVER_MODE") == "notimings":
            return self._send(200, {"content": "x", "tokens": tokens, "stop_type": "limit"})
        self._send(200, {"content": "x", "tokens": tokens, "stop_type": "limit", "timings": t})

    def log_message(self, *args):
        pass


def main():
    if "--version" in ARGV:
        print("version: 4242 (fake0000)\nbuilt with a test", file=sys.stderr)
        return
    if "--list-devices" in ARGV:  # arg.cpp's: GPU devices only, "(none)" for a CPU build
        listed = [d for d in os.environ.get("FAKE_SERVER_DEVICES", "").split(",") if d]
        print("Available devices:\n" + "\n".join(f"  {d}: a test device (1024 MiB, 1024 MiB free)" for d in listed)
              if listed else "Available devices:\n  (none)")
        return
    if "--help" in ARGV:
        lacks = set(os.environ.get("FAKE_SERVER_LACKS", "").split(","))
        flags = open(os.path.join(os.path.dirname(__file__), "data", "llama_cpp_0.3.36_flags.txt")).read().split("\n")
        print("\n".join(f.split("\t")[0] for f in flags if f and f.split("\t")[0] not in lacks))
        return
    unknown = [t for t in TYPES if t not in KNOWN_TYPES]
    if unknown:  # arg.cpp's --spec-type handler throws, and llama-server exits before it listens
        print(f'error while handling argument "--spec-type": unknown speculative type: {unknown[0]}\n\nusage:\n'
              "--spec-type TYPE    the speculative type\n\nto show complete usage, run with -h", file=sys.stderr,
              flush=True)
        sys.exit(1)
    mode = os.environ.get("FAKE_SERVER_MODE", "ok")
    if mode == "badarg":  # arg.cpp: the error, then the usage text, whose last line is no reason
        print('error while handling argument "--temp": stof\n\nusage:\n-h,    --help    print usage and exit\n\n'
              "to show complete usage, run with -h", file=sys.stderr, flush=True)
        sys.exit(1)
    if mode == "assert":  # a failed assertion, then the backtrace gdb prints
        print("load_tensors: loading model\n/llama.cpp/common/speculative.cpp:123: GGML_ASSERT(n_max > 0) failed\n"
              "[New LWP 4242]\n#0  0x00007f in wait4 ()\n[Inferior 1 (process 4241) detached]", file=sys.stderr,
              flush=True)
        os._exit(134)
    if mode == "exit":
        print("fake: failed to load model 'nowhere.gguf'", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "silent":
        time.sleep(600)
        return
    if SPEC and os.environ.get("FAKE_SERVER_SAYS"):
        print(os.environ["FAKE_SERVER_SAYS"], file=sys.stderr, flush=True)
    port = int(ARGV[ARGV.index("--port") + 1])
    assert ARGV[ARGV.index("--host") + 1] == "127.0.0.1"
    print(f"fake: listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
