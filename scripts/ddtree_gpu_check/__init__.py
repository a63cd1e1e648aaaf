"""ddtree-deploy's GPU check: what one lent GPU machine (an H200 with torch, Triton and nvcc,
without SGLang, sgl-kernel, flashinfer or apache-tvm-ffi) can prove about DDTree on SGLang's
v2 worker, in one command under 10 minutes.

    carry.py         SGLang's files from the release wheel (the CUDA tree kernel's include
                     closure, the Triton attention modules, the hybrid recurrent kernels'
                     files), the manifest, the travel size
    tree_abi.py      nvcc build of SGLang's tree.cuh with our host wrapper, ctypes binding
    csrc/            our host wrapper (tree_abi.cu) and tvm-ffi / DLPack shim headers
    kernel_model.py  THE transcription of SGLang's CUDA tree-verify kernels and host checks
                     (the pre-launch guard, the dry run's stand-in, and what the CPU suite's
                     stand-ins in tests/v2_kernel_standins.py wrap) and the comparison with
                     the DDTree layout
    ddtree.py        the worker's step from the payload's own modules; the configurations
                     the plugin accepts and the ones it refuses
    checks_tree.py   tree kernel + lineage per configuration, refusals, known answers,
                     greedy verify
    attention.py     SGLang's Triton extend attention with the tree mask vs a dense reference
    hybrid.py        scripts/gpu_check_hybrid.py (the recurrent kernels' tree path) as a part
                     of the check, in a process of its own
    step.py          the whole step without host sync, in a CUDA graph, and its timings
    report.py        PASS / FAIL / SKIP lines, summary, JSON report
    run.py           the order of it all; entry point scripts/gpu_check.py
"""
