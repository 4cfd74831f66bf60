"""Compare the PTX of every kernel instantiation the launchers use between a git
revision and the working tree (no GPU: NVRTC only).

What it measures: whether a change to the kernel sources (.cu files and the shared
headers in tsm_core/include/) changes the code that is compiled. For each family
(gemm, conv, batched by default) the name expressions come from the launchers' own
enumerators in the working tree (``tiled.kernels.instantiations``,
``conv.configs.all_names``, ``batched.launch.name_expr`` over
``batched.plan.VERSIONS``, plus the helper kernels); each source (the revision's,
read with ``git show``, and the tree's) is expanded the way ``runtime/compile.py``
does it and compiled to PTX for compute_90 (compute_90a for ``ARCH_SPECIFIC`` names;
gemm's cp.async kernels for compute_80 too). Each ``.entry`` is compared after
dropping comments, ``.file`` and ``.loc`` lines; where one differs, the script says whether
the difference is only register renumbering, and then compares ptxas's register
and spill report (``compile_report``) of both sources.

An entry that differs where many are compiled in one program is compiled again
alone, as the launchers build it (``get_kernel``: one name expression a module).

Usage::

    LD_LIBRARY_PATH=.../nvidia/cuda_nvrtc/lib python dev/ptx_compare.py --ref main

Exit status 0 when every entry is identical, or differs in register names only, or
is one that NVVM does not compile deterministically (two compiles of the unchanged
source differ), each of the last two with the same ptxas register and spill report
from both sources; 1 otherwise. (ptxas's figures are themselves one draw for an
entry that is not deterministic.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "tsm_core"
CACHE = Path(os.environ.get("PTX_COMPARE_CACHE", "/tmp/ptx_compare_cache"))
CHUNK = 24
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


# ------------------------------------------------------------------ sources


def _reader(ref):
    """path (relative to the package) -> text, at git revision `ref` or in the tree (None)."""
    if ref is None:
        return lambda rel: (ROOT / PKG / rel).read_text()
    return lambda rel: subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{PKG}/{rel}"],
                                      check=True, capture_output=True, text=True).stdout


def expanded(family, ref=None):
    """The family's source with its includes inlined once each (runtime/compile.py's rule)."""
    from tsm_core.runtime import compile as _compile

    read = _reader(ref)
    seen = set()

    def expand(rel):
        def repl(m):
            inc = "include/" + m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(inc)

        return _INCLUDE.sub(repl, read(rel))

    return expand(_compile.KERNELS[family])


# ------------------------------------------------------------------ names


def names(family):
    import numpy as np

    if family == "gemm":
        from tsm_core.tiled import kernels as g

        out = list(g.instantiations())
        out += [f"realign_copy<{t}>" for t in ("float", "double")]
        out += [f"block_sum<{t}>" for t in ("float", "double")]
        return sorted(set(out))
    if family == "conv":
        from tsm_core.conv import configs as cconfigs

        return sorted(set(cconfigs.all_names()))
    if family == "batched":
        from tsm_core.batched import launch as blaunch
        from tsm_core.batched import plan as bplan

        out = []
        for v in bplan.VERSIONS:
            for dt in (np.float32, np.float64):
                if v in bplan.FLOAT32_ONLY and dt == np.float64:
                    continue
                out.append(blaunch.name_expr(dt, v))
        return sorted(set(out))
    raise ValueError(family)


def targets(family):
    """[(arch, [names])] to compile."""
    from tsm_core.runtime import compile as _compile

    groups: dict = {}
    for n in names(family):
        opt = _compile.options_for(n)
        arch = opt[0].split("=")[1].replace("sm_", "compute_") if opt[0].startswith("-arch") \
            else "compute_90"
        groups.setdefault(arch, []).append(n)
        if family == "gemm" and arch == "compute_90" and n.startswith(("gemm_async", "gemm_pipe")):
            # the cp.async kernels also build for the A100 (sm_80), another code path
            groups.setdefault("compute_80", []).append(n)
    return sorted(groups.items())


# ------------------------------------------------------------------ compile


def _compile_chunk(args):
    """{name: normalized PTX of its entry} for one chunk (cached on disk)."""
    src, arch, chunk = args
    key = hashlib.sha256(json.dumps([src, arch, chunk]).encode()).hexdigest()[:24]
    path = CACHE / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(src, "k.cu", [], [])
    try:
        for n in chunk:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, [f"-arch={arch}", "-std=c++17"])
        except Exception as exc:
            raise RuntimeError(f"{arch} {chunk[:2]}...: {nvrtc.getProgramLog(prog)}") from exc
        ptx = nvrtc.getPTX(prog)
        if isinstance(ptx, bytes):
            ptx = ptx.decode()
        lowered = {n: nvrtc.getLoweredName(prog, n) for n in chunk}
    finally:
        nvrtc.destroyProgram(prog)
    ents = entries(ptx)
    out = {n: ents.get(low, f"<missing entry {low}>") for n, low in lowered.items()}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return out


def normalize(ptx):
    lines = []
    for line in ptx.splitlines():
        s = line.split("//", 1)[0].rstrip()
        t = s.strip()
        if not t or t.startswith((".file", ".loc")):
            continue
        lines.append(s)
    return "\n".join(lines)


def entries(ptx):
    """{mangled name: normalized text of its .entry}."""
    text = normalize(ptx)
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\(", text):
        start = m.start()
        # the entry ends where the next .entry / .func starts (or the file ends)
        nxt = re.search(r"\n(?:\.visible\s+|\.weak\s+)?\.(?:entry|func)\s", text[m.end():])
        end = m.end() + nxt.start() if nxt else len(text)
        out[m.group(1)] = text[start:end]
    return out


def ptx_of(family, ref, pool):
    src = expanded(family, ref)
    jobs = [(src, arch, ns[i:i + CHUNK]) for arch, ns in targets(family)
            for i in range(0, len(ns), CHUNK)]
    out = {}
    for (src_, arch, _), res in zip(jobs, pool.map(_compile_chunk, jobs)):
        out.update({(arch, n): t for n, t in res.items()})
    return out


_REG = re.compile(r"%(r|rd|f|fd|p|rs|h|hh|SP|SPL)(\d+)\b")
_REGDECL = re.compile(r"^\s*\.reg\s+\.\w+\s+%\w+<\d+>;$", re.M)


def canonical(text):
    """`text` with its virtual registers renamed in order of first use (per class) and
    the register declarations (counts) dropped: equal when two entries differ only in
    how NVVM numbered their registers."""
    text = _REGDECL.sub("", text)
    seen: dict = {}
    count: dict = {}

    def ren(m):
        cls = m.group(1)
        key = (cls, m.group(2))
        if key not in seen:
            seen[key] = count[cls] = count.get(cls, -1) + 1
        return f"%{cls}{seen[key]}"

    return _REG.sub(ren, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="main", help="git revision to compare against")
    ap.add_argument("--families", nargs="+", default=["gemm", "conv", "batched"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--names-only", action="store_true", help="print the counts and stop")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    bad = 0
    with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        for fam in args.families:
            tg = targets(fam)
            total = sum(len(ns) for _, ns in tg)
            print(f"{fam}: {total} entries ({', '.join(f'{a}: {len(ns)}' for a, ns in tg)})",
                  flush=True)
            if args.names_only:
                continue
            old = ptx_of(fam, args.ref, pool)
            new = ptx_of(fam, None, pool)
            same = [k for k in old if old[k] == new.get(k)]
            diff = [k for k in old if old[k] != new.get(k)]
            # The launchers compile one name expression per module (runtime/compile.py
            # get_kernel), and NVVM's output for one entry can depend on the other
            # entries of its module: compare a differing entry again as it is built.
            if diff:
                print(f"  {len(diff)} differ in multi-entry modules; compiling those one per "
                      "module, as the launchers do", flush=True)
                alone = [(src, arch, [n]) for arch, n in diff
                         for src in (expanded(fam, args.ref), expanded(fam, None))]
                res = list(pool.map(_compile_chunk, alone))
                for i, (arch, n) in enumerate(diff):
                    old[arch, n], new[arch, n] = res[2 * i][n], res[2 * i + 1][n]
                same = [k for k in old if old[k] == new.get(k)]
                diff = [k for k in old if old[k] != new.get(k)]
            # NVVM is not deterministic for some entries: two compiles of the same
            # source give different PTX. For those, identity cannot be asked of a
            # change; they are named, and ptxas's report of both sources compared.
            unstable = set()
            if diff:
                again = [(expanded(fam, args.ref) + f"\n// again {os.getpid()}\n", arch, [n])
                         for arch, n in diff]
                for (arch, n), res in zip(diff, pool.map(_compile_chunk, again)):
                    if res[n] != old[arch, n]:
                        unstable.add((arch, n))
            renum = [k for k in diff if canonical(old[k]) == canonical(new.get(k, ""))]
            print(f"  identical: {len(same)} / {len(old)}", flush=True)
            for arch, n in diff:
                kind = ("register names only" if (arch, n) in renum else
                        "the unchanged source compiles differently too (NVVM not deterministic)"
                        if (arch, n) in unstable else "CODE DIFFERS")
                print(f"  differs ({kind}): {arch} {n}", flush=True)
                if (arch, n) not in renum and (arch, n) not in unstable:
                    bad += 1
                    continue
                # register renumbering: compare ptxas's report of both sources
                from tsm_core.runtime import compile as _compile

                sm = arch.replace("compute_", "sm_")
                reps = []
                for ref in (args.ref, None):
                    text = expanded(fam, ref)
                    orig = _compile.source
                    _compile.source = lambda f, t=text: t  # noqa: E731
                    try:
                        r = _compile.compile_report(fam, n, arch=sm.rstrip("a"))
                    finally:
                        _compile.source = orig
                    reps.append((r.registers, r.spill_stores, r.spill_loads, r.stack_frame))
                ok = reps[0] == reps[1]
                print(f"    ptxas (regs, spill st, spill ld, stack): {reps[0]} -> {reps[1]}"
                      f" {'same' if ok else 'DIFFERENT'}", flush=True)
                bad += not ok
    print("RESULT:", "identical" if not bad else f"{bad} entries differ", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
