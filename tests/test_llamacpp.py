"""llamacpp.py: the memory llama.cpp allocates, read per buffer and device from its log, and its log
captured."""
from harness.llamacpp import captured_log, memory_breakdown, on_host


LOG = """load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
load_tensors:        CUDA0 model buffer size =  1000.50 MiB
llama_context:  CUDA_Host  output buffer size =     0.58 MiB
llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =     3.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    10.00 MiB
sched_reserve:      CUDA0 compute buffer size =   302.75 MiB
"""


def test_memory_breakdown_reads_llamacpp_buffer_lines():
    got = {(b["buffer"], b["kind"]): b["bytes"] for b in memory_breakdown(LOG)}
    assert got == {("CPU_Mapped", "model"): round(92.10 * 2**20), ("CUDA0", "model"): round(1000.5 * 2**20),
                   ("CUDA_Host", "output"): round(0.58 * 2**20), ("CUDA0", "kv"): 48 * 2**20,  # two caches: summed
                   ("CUDA0", "compute"): round(302.75 * 2**20),  # reserved again: the last size stands
                   ("CUDA_Host", "compute"): 10 * 2**20}
    assert [on_host(b) for b in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "CUDA0", "Vulkan0", "Metal")] == \
        [True, True, True, True, False, False, False]


def test_a_nested_log_capture_keeps_its_lines_to_itself():
    import harness.llamacpp as lib
    with captured_log() as outer:
        lib._capture.append("a")
        with captured_log() as inner:  # the flash-attention probe's context: its buffers are not the engine's
            lib._capture.append("b")
        lib._capture.append("c")
    assert outer == ["a", "c"] and inner == ["b"] and lib._capture is None
