"""Build a CUDA kernel file as a host shared library for the CPU kernel tests
(test_inception_kernel_host.py, test_batched_kernel_host.py): the test's C++20 shim
(threads for CUDA threads, a std::barrier for __syncthreads) prepended to the source."""

import ctypes
import subprocess

import pytest


def build(directory, name: str, shim: str, source: str) -> ctypes.CDLL:
    """Compile ``shim + source`` into ``directory/name.so`` with g++ and load it.

    Skips the test if g++ cannot build the shim alone (no C++20 <barrier>); fails it
    if the kernel source does not build with the shim."""
    probe_src = directory / "probe.cpp"
    probe_src.write_text(shim + "int main() { return 0; }\n")
    probe = subprocess.run(["g++", "-std=c++20", "-pthread", "-w", "-o", str(directory / "probe"),
                            str(probe_src)], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip("g++ cannot build the C++20 shim (<barrier>): " + probe.stderr[-300:])
    cpp, so = directory / f"{name}.cpp", directory / f"{name}.so"
    cpp.write_text(shim + source)
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
                        "-o", str(so), str(cpp)], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"{name}: the kernel does not build as C++ with the shim:\n" + r.stderr[-4000:])
    return ctypes.CDLL(str(so))
