"""Where a kernel's issue slots go, from its SASS (no GPU needed):

    python dev/sass_regions.py FAMILY NAME_EXPR [--arch sm_90] [--min-ffma 64]
    python dev/sass_regions.py gemm "gemm_ws<1, 1, 1, false, 4, 224, false>"
    python dev/sass_regions.py batched "tsm_batched_gemm<float, 3>"

Compiles one instantiation through NVRTC (as `_compile.compile_report` does, with the
instantiation's own options), disassembles the cubin with `nvdisasm -hex` (on PATH,
or from the nvidia-cuda-nvdisasm wheel) and decodes each instruction's control bits
(sm_70 and later: the stall count is bits 105-108 of the 128-bit word). It prints
every region between two barriers (BAR.SYNC, BAR.ARV) with at least --min-ffma
FFMAs: its instructions, the FFMA share, and the stall cycles the control codes fix
(at least one an instruction). A warp cannot issue faster than those stall counts
allow; a scheduler hides one warp's waits only with another warp's instructions.
Measured on 2026-11-24 (docs/lab/tiled.md): gemm_pipe's
k-tile 83% FFMAs at 1.18 stall cycles an instruction, gemm_ws's consumers 95% at 1.06,
the batched kernel's k-tiles 18-54% at 1.5-2.3.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    import site

    for base in site.getsitepackages() + [site.getusersitepackages()]:
        for p in glob.glob(os.path.join(base, "nvidia", "cu*", "bin", "nvdisasm")):
            return p
    raise SystemExit("nvdisasm not found: put it on PATH or pip install nvidia-cuda-nvdisasm")


def cubin(family: str, name: str, arch: str, tmp: Path) -> Path:
    """The instantiation's cubin: NVRTC's PTX through ptxas where ptxas is on PATH (an
    nvdisasm newer than NVRTC may not read NVRTC's own cubin), else NVRTC's cubin."""
    from cupy_backends.cuda.libs import nvrtc

    from tsm_core.runtime import compile as _compile

    prog = nvrtc.createProgram(_compile.source(family), f"{family}.cu", [], [])
    try:
        nvrtc.addNameExpression(prog, name)
        opts = list(_compile.options_for(name))
        if not any(o.startswith("-arch=") for o in opts):
            opts.insert(0, f"-arch={arch}")
        target = next(o for o in opts if o.startswith("-arch=")).split("=")[1]
        nvrtc.compileProgram(prog, opts)
        out = tmp / "k.cubin"
        ptxas = shutil.which("ptxas")
        if ptxas:
            ptx = tmp / "k.ptx"
            text = nvrtc.getPTX(prog)
            ptx.write_bytes(text.encode() if isinstance(text, str) else text)
            subprocess.run([ptxas, f"-arch={target}", "-O3", str(ptx), "-o", str(out)],
                           check=True)
        else:
            out.write_bytes(nvrtc.getCUBIN(prog))
        return out
    finally:
        nvrtc.destroyProgram(prog)


def instructions(sass: str) -> list[dict]:
    """(address, text, stall count) of each instruction of `nvdisasm -hex` output."""
    lines = sass.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/", line)
        if not m or i + 1 >= len(lines):
            continue
        hi = re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1])
        if not hi:
            continue
        ctrl = (int(hi.group(1), 16) >> 41) & 0x1FFFFF
        out.append(dict(addr=int(m.group(1), 16), text=m.group(2).strip(), stall=ctrl & 0xF))
    return out


def opcode(text: str) -> str:
    words = text.split()
    return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def regions(ins: list[dict], min_ffma: int) -> list[dict]:
    out, start = [], 0
    for k, x in enumerate(ins):
        if "BAR.SYNC" in x["text"] or "BAR.ARV" in x["text"] or k == len(ins) - 1:
            seg = ins[start:k + 1]
            start = k + 1
            ffma = sum(opcode(y["text"]) == "FFMA" for y in seg)
            if ffma >= min_ffma:
                out.append(dict(addr=seg[0]["addr"], n=len(seg), ffma=ffma,
                                stall=sum(y["stall"] for y in seg)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("family")
    ap.add_argument("name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--min-ffma", type=int, default=64)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = cubin(args.family, args.name, args.arch, Path(tmp))
        sass = subprocess.run([nvdisasm(), "-hex", "-c", str(path)], check=True,
                              capture_output=True, text=True).stdout
    ins = instructions(sass)
    print(f"{args.name}: {len(ins)} instructions")
    for r in regions(ins, args.min_ffma):
        print(f"  region at 0x{r['addr']:05x}: {r['n']} instructions, {r['ffma']} FFMA "
              f"({r['ffma'] / r['n']:.0%}), {r['stall']} stall cycles "
              f"({r['stall'] / r['n']:.2f} an instruction)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
