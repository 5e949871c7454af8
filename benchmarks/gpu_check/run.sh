#!/usr/bin/env bash
# Issue 47's GPU check: the one command for the device machine, run from the repository root after
# benchmarks/gpu_check/prepare.py made .gpucheck/ (carried). docs/gpu.md, "The GPU check", gives the call.
#
#   bash benchmarks/gpu_check/run.sh [all|build|check] [--cpu-dry-run]
#
# build: llama.cpp's libllama/ggml and llama-server, CUDA for sm_90 alone, into build/gpu-check (ignored, so a
# warm machine keeps it for a second call); check: the harness against that build (LLAMA_CPP_LIB_PATH); all:
# both. Everything lands under $OUT: log.txt, summary.tsv, build.log, system.txt, runs.tar.gz (5 files, the
# device returns 8). --cpu-dry-run (or GPU_CHECK_CPU_DRY_RUN=1) does the same steps with CPU flags, a CPU
# label and no offload, to rehearse here. Without it, no nvcc or no GPU is a refusal: nothing runs on the CPU
# under a GPU label.
set -uo pipefail
mode=all dry=${GPU_CHECK_CPU_DRY_RUN:-0}
for a in "$@"; do
  case $a in
    all|build|check) mode=$a ;;
    --cpu-dry-run) dry=1 ;;
    *) echo "usage: run.sh [all|build|check] [--cpu-dry-run]" >&2; exit 2 ;;
  esac
done

# refuse first, with builtins only (the test runs this with an empty PATH)
if [ "$dry" != 1 ]; then
  if ! command -v nvcc >/dev/null; then
    echo "gpu-check: no nvcc on PATH, so no CUDA build here: refusing (a CPU rehearsal is --cpu-dry-run)" >&2
    exit 3
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu-check: no NVIDIA GPU found (nvidia-smi -L lists none): refusing (a CPU rehearsal is --cpu-dry-run)" >&2
    exit 3
  fi
fi

here=${BASH_SOURCE[0]%/*}
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 2
pack=${GPU_CHECK_PACK:-$root/.gpucheck}
work=${GPU_CHECK_WORK:-$root/build/gpu-check}
out=${OUT:-$root/build/gpu-check-out}
py=${PYTHON:-python3}
mkdir -p "$work" "$out"
exec > >(tee -a "$out/log.txt") 2>&1

if [ "$dry" = 1 ]; then
  label=cpu-dry-run jobs=${GPU_CHECK_JOBS:-2} ngl=0
  backend=(-DGGML_CUDA=OFF)
else
  label=cuda-sm90 jobs=${GPU_CHECK_JOBS:-16} ngl=99
  # the H200 alone (compute capability 9.0): one architecture compiles ggml-cuda's kernels once
  backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
bld=$work/build-$label
runs=$work/runs-$label
failed=0
printf 'step\tstatus\tseconds\n' > "$out/summary.tsv"

step() {  # step NAME COMMAND...: run it, timed; its status and seconds go to summary.tsv
  local name=$1 t0=$SECONDS rc
  shift
  echo "== $name: $*"
  "$@"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$([ $rc = 0 ] && echo ok || echo "failed ($rc)")" $((SECONDS - t0)) \
    | tee -a "$out/summary.tsv"
  [ $rc = 0 ] || failed=1
  return $rc
}

pack_runs() { [ -d "$runs" ] && tar -czf "$out/runs.tar.gz" -C "$work" "${runs##*/}"; }
trap pack_runs EXIT

{ date -u; uname -a; nproc; echo "label: $label"; command -v nvcc >/dev/null && nvcc --version | tail -2
  command -v nvidia-smi >/dev/null && nvidia-smi; cmake --version | head -1; "$py" --version; } \
  > "$out/system.txt" 2>&1

# ggml's AMX kernels are dropped as the Makefile does (ggml-org/llama.cpp#20824); shared libraries, since the
# harness loads libllama.so; no curl, OpenSSL or web UI (nothing can be fetched there).
cublas=()
find_cublas() {  # ggml-cuda links cuBLAS: the toolkit's, else the nvidia wheels' that the image holds for PyTorch
  local tk nv inc
  tk=$(dirname "$(command -v nvcc)")/..
  ls "$tk"/include/cublas_v2.h "$tk"/targets/*/include/cublas_v2.h /usr/local/cuda*/include/cublas_v2.h \
    >/dev/null 2>&1 && return
  nv=$("$py" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) || return 0
  inc=$(find "$nv" -name cublas_v2.h -print -quit)
  [ -n "$inc" ] || return 0
  mkdir -p "$work/cublas"
  find "$nv" -name 'libcublas*.so*' -exec ln -sf {} "$work/cublas/" \;
  for l in cublas cublasLt; do
    ln -sf "$(ls "$work/cublas/lib$l.so."* | head -1)" "$work/cublas/lib$l.so"
  done
  echo "gpu-check: no cuBLAS in the toolkit; using the wheels' ($inc)"
  cublas=(-DCUDA_cublas_LIBRARY="$work/cublas/libcublas.so" -DCUDA_cublasLt_LIBRARY="$work/cublas/libcublasLt.so"
          -DCMAKE_CUDA_FLAGS="-I${inc%/*}")
  export LD_LIBRARY_PATH=$work/cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

build() {
  tar -xJf "$pack/llama.cpp.tar.xz" -C "$work" || return
  [ "$dry" = 1 ] || find_cublas
  cmake -S "$work/llama.cpp" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__ "${backend[@]}" "${cublas[@]}" \
    && cmake --build "$bld" --config Release --target llama llama-server -j"$jobs" || return
  if [ "$dry" != 1 ] && [ ! -f "$bld/bin/libggml-cuda.so" ]; then
    echo "gpu-check: the build made no libggml-cuda.so: refusing to go on" >&2
    return 4
  fi
  ls -l "$bld/bin"
}

if [ "$mode" != check ]; then
  step "build ($label, -j$jobs)" build > "$out/build.log" 2>&1
  tail -n 3 "$out/build.log"
  grep -q $'^build.*\tok\t' "$out/summary.tsv" || { tail -n 40 "$out/build.log"; exit 1; }
fi
[ "$mode" = build ] && exit 0
if [ ! -f "$bld/bin/libllama.so" ] || [ ! -x "$bld/bin/llama-server" ]; then
  echo "gpu-check: no build in $bld (the machine went back?): run it with 'all'" >&2
  exit 1
fi

mkdir -p "$work/site" "$runs"
tar -xJf "$pack/site.tar.xz" -C "$work/site" || exit 1
[ -d "$work/cublas" ] && export LD_LIBRARY_PATH=$work/cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$work/site:$root LLAMA_CPP_LIB_PATH=$bld/bin HARNESS_NATIVE_BIN=$bld/bin PYTHONUNBUFFERED=1
harness() { "$py" -c 'from harness.cli import main; main()' "$@"; }
T=$work/models/tiny-target.gguf D=$work/models/tiny-draft.gguf
step "tiny models" "$py" benchmarks/gpu_check/prepare.py --models "$work/models" || exit 1
P=(--prompts tests/data/prompts.jsonl --per-category 2 --max-tokens 32)

# the library loaded is the one built, and offloads exactly when the label says so
step "load" "$py" -c "
import sys, llama_cpp, harness.llamacpp as l
print(llama_cpp.__file__, l.gpu_offload_supported()); print(l.system_info())
sys.exit(l.gpu_offload_supported() != ($ngl > 0))" || exit 1

equal() { harness run "$T" --draft "$D" --prompt "Write a binary search in Python" --max-tokens 64 --gamma 4 \
            --ngl $ngl --ngl-draft $ngl --baseline | tee "$runs/run.txt" && grep -q "outputs equal" "$runs/run.txt"; }
step "run --ngl $ngl --ngl-draft $ngl --baseline: greedy outputs equal" equal
# the sweep; on the CPU the GPU configurations are recorded as skipped, the refusal a GPU label needs
skip=() && [ "$dry" = 1 ] && skip=(--skip-unsupported)
step "bench --ngl 0,99 --ngl-draft 0,99 --gamma 1,4" harness bench --target "$T" --draft "$D" --gamma 1,4 \
  --ngl 0,99 --ngl-draft 0,99 "${P[@]}" "${skip[@]}" --out "$runs/bench"
pack_runs
step "bench --engine server -ngl $ngl -ngld $ngl" harness bench --engine server --target "$T" --draft "$D" \
  --gamma 4 --ngl $ngl --ngl-draft $ngl "${P[@]}" --llama-server "$bld/bin/llama-server" --out "$runs/server"
step "server-check -ngl $ngl -ngld $ngl" harness server-check --per-category 2 --max-tokens 32 \
  "$bld/bin/llama-server -m $T --spec-type draft-simple -md $D --spec-draft-n-max 4 -ngl $ngl -ngld $ngl"
if [ "$dry" != 1 ]; then  # the report must name CUDA and the device, beside its memory table's device rows
  step "report names CUDA" grep -rl "CUDA" "$runs/bench" --include='*.md'
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$out/system.txt"
fi
echo "gpu-check ($label): $([ $failed = 0 ] && echo all steps ok || echo SOME STEPS FAILED); see $out/summary.tsv"
exit $failed
