"""Check in SASS that no barrier arrive of a warp-specialised kernel can run while
the thread's shared-memory loads are in flight: every register an LDS writes must be
read before the next SYNCS.ARRIVE (an mbarrier arrive does not wait for outstanding
loads, so a buffer refilled after the barrier could overwrite words a load has yet
to read) or BAR.ARV (a named barrier's arrive: whether it waits is not known; the
check reports it). Needs nvcc and nvdisasm, no GPU:

    python dev/sass_arrive_check.py ["kmeans_assign_ws<1, 0, 4, 4>" ...]
    python dev/sass_arrive_check.py --gemm-ws

Exit 1 where a load is still pending at an arrive.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from tsm_core.kmeans import configs
from tsm_core.runtime import compile as _compile

GEMM_WS_SIG = ("(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, "
               "int K, long long lda, long long ldb, long long rsc, long long csc, float alpha, float beta, "
               "const long long* __restrict__ desc)")
SIG = ("(const unsigned* __restrict__ X, i64 ldw, int n, int d, const unsigned* __restrict__ Ct, "
       "const float* __restrict__ cn, const float* __restrict__ mu, int k, float ea, float eb, "
       "const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev, "
       "int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts, int cap)")


def pending_at_arrives(sass: str):
    """(line, registers an LDS wrote and nothing read yet) at each per-thread arrive."""
    out, pending = [], {}
    for i, line in enumerate(sass.splitlines()):
        if not re.search(r"/\*[0-9a-f]{4}\*/", line):
            continue
        t = line.split("*/", 1)[1].strip().rstrip(" ;")
        ops = t.split(" ", 1)[1] if " " in t else ""
        if t.startswith("@"):
            ops = ops.split(" ", 1)[1] if " " in ops else ""
        regs = re.findall(r"\bR\d+\b", ops)
        if "SYNCS.ARRIVE" in t and "A1T0" in t or "BAR.ARV" in t:
            out.append((i, sorted(pending)))
            pending = {}
            continue
        m = re.match(r"(@!?P\d+ )?LDS(\.(\d+))? (R\d+),", t)
        if m:
            for r in regs[1:]:
                pending.pop(r, None)
            n = {"64": 2, "128": 4}.get(m.group(3), 1)
            for j in range(n):
                pending[f"R{int(m.group(4)[1:]) + j}"] = i
            continue
        for r in regs if t.split(" ")[0].lstrip("@!P0123456789 ").startswith(("ST", "SYNCS", "HGMMA")) else regs[1:]:
            pending.pop(r, None)
    return out


def main(names, family="kmeans_mma", sig=SIG):
    nvcc, nvdisasm = shutil.which("nvcc"), shutil.which("nvdisasm") or os.environ.get("NVDISASM")
    if not nvcc or not nvdisasm:
        sys.exit("needs nvcc and nvdisasm (or NVDISASM=path)")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w") as f:
            f.write(_compile.source(family))
            for name in names:
                f.write(f"\ntemplate __global__ void {name}{sig};\n")
        cub = os.path.join(tmp, "k.cubin")
        subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-o", cub, src], check=True)
        sass = subprocess.run([nvdisasm, "-c", cub], check=True, capture_output=True, text=True).stdout
    for block in sass.split(".text.")[1:]:
        name = block.split(":", 1)[0].split("\n")[0]
        for line, regs in pending_at_arrives(block):
            ok = not regs
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name[:60]} arrive at line {line}: {regs or 'no load pending'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--gemm-ws"]:
        from tsm_core.tiled import kernels
        main([kernels.ws_name()], "gemm", GEMM_WS_SIG)
    main(sys.argv[1:] or [f"kmeans_assign_ws<{t}, {m}, {ns}, {configs.ws_stages(ns, 2 if t == 3 else 1)}>"
                          for t, m, ns in ((1, 0, 4), (0, 0, 16), (3, 1, 2), (3, 1, 8), (2, 0, 5))])
