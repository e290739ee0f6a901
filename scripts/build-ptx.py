#!/usr/bin/env python3
"""Compiles kernels-ptx/*.cu to PTX with NVRTC 12.6 for compute_72, compute_87 and compute_90.

    python3 scripts/build-ptx.py          # writes kernels-ptx/NAME.compute_XX.ptx
    python3 scripts/build-ptx.py --check  # fails if a committed .ptx differs from its source

NVRTC comes from PyPI (`pip install "nvidia-cuda-nvrtc-cu12==12.6.*"`); no CUDA toolkit or GPU
is needed. The compute_72 PTX is for the AGX Xavier (JetPack 5, CUDA 11.4: PTX ISA 7.4 at most):
NVRTC 12.6 writes `.version 8.5`, and these kernels use nothing newer than ISA 7.0
(ld.acquire/st.release/__nanosleep need sm_70 and ISA 6.0-7.0), so the header is lowered to 7.4.
The H200 run loads both files (docs/HIL.md); loading the lowered one on a real Xavier is untested.
The compute_90 PTX (H100/H200) adds what only sm_90 has: programmatic dependent launch
(`griddepcontrol`, decode.cu's `pdl_wait`); the others compile it out.
"""
import ctypes
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHS = {"compute_72": "7.4", "compute_87": None, "compute_90": None}
OPTIONS = ["--std=c++17", "-default-device", f"--include-path={os.path.join(ROOT, 'kernels-ptx')}"]


def find_nvrtc():
    try:
        import nvidia.cuda_nvrtc  # noqa: F401  (the PyPI wheel)

        base = os.path.dirname(nvidia.cuda_nvrtc.__file__)
        libs = glob.glob(os.path.join(base, "lib", "libnvrtc.so*"))
        if libs:
            return ctypes.CDLL(sorted(libs)[0])
    except ImportError:
        pass
    sys.exit(
        'NVRTC not found: pip install "nvidia-cuda-nvrtc-cu12==12.6.*" (see scripts/build-ptx.py)'
    )


def compile_ptx(nvrtc, name, src, arch):
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None))
    opts = OPTIONS + [f"--gpu-architecture={arch}"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    log_size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"{name} ({arch}) failed to compile:\n{log.value.decode()}")
    size = ctypes.c_size_t()
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf))
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


def check(nvrtc, rc):
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"nvrtc error {rc}: {nvrtc.nvrtcGetErrorString(rc).decode()}")


def version(nvrtc):
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def main():
    check_only = "--check" in sys.argv
    nvrtc = find_nvrtc()
    if version(nvrtc)[:2] != (12, 6):
        sys.exit(f"NVRTC {version(nvrtc)} found; the committed PTX is made with 12.6")
    stale = []
    for cu in sorted(glob.glob(os.path.join(ROOT, "kernels-ptx", "*.cu"))):
        name = os.path.basename(cu)[:-3]
        src = open(cu).read()
        for arch, lower_to in ARCHS.items():
            ptx = compile_ptx(nvrtc, name + ".cu", src, arch)
            if lower_to:
                ptx = ptx.replace(".version 8.5", f".version {lower_to}", 1)
            out = os.path.join(ROOT, "kernels-ptx", f"{name}.{arch}.ptx")
            if check_only:
                old = open(out).read() if os.path.exists(out) else None
                if old != ptx:
                    stale.append(os.path.relpath(out, ROOT))
            else:
                with open(out, "w") as f:
                    f.write(ptx)
                print(f"wrote {os.path.relpath(out, ROOT)} ({len(ptx)} bytes)")
    if stale:
        sys.exit("PTX out of date with its source (run python3 scripts/build-ptx.py): " + ", ".join(stale))
    if check_only:
        print("PTX matches its sources")


if __name__ == "__main__":
    main()
