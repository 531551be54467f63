"""Builds torch_masked._C: our C++ CPU kernels always, our CUDA kernels when
torch is a CUDA build and a CUDA toolkit (nvcc) is found. No GPU is needed to
build.

Environment switches:
  TORCH_MASKED_CUDA=0     CPU-only build, even where CUDA is available.
  TORCH_MASKED_CUDA=1     insist on CUDA: fail if it cannot be built.
  (unset)                 CUDA when possible, else CPU only.
  DEBUG=1                 -O0 -g instead of -O3 -g0.
  TORCH_CUDA_ARCH_LIST    GPU architectures, e.g. "9.0" or "8.0;9.0+PTX".
                          Default: the visible GPU's, else "8.0;9.0+PTX".
"""

import glob
import os
import shutil
import sys

from setuptools import setup

import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"


def say(msg):
    print(f"torch_masked setup: {msg}", file=sys.stderr)


def find_cuda_home():
    """CUDA_HOME if set, else CUDA_PATH, else /usr/local/cuda, else the folder above nvcc."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return home
    return None


def decide_cuda():
    switch = os.environ.get("TORCH_MASKED_CUDA", "").strip()
    if switch == "0":
        return False, "TORCH_MASKED_CUDA=0"
    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} is not a CUDA build")
    cuda_home = find_cuda_home()
    if cuda_home is None:
        reasons.append("no nvcc found (set CUDA_HOME)")
    if reasons:
        if switch == "1":
            raise RuntimeError("TORCH_MASKED_CUDA=1 but CUDA cannot be built: " + "; ".join(reasons))
        return False, "; ".join(reasons)
    # torch.utils.cpp_extension reads CUDA_HOME at import time; keep the two in step.
    os.environ["CUDA_HOME"] = cuda_home
    import torch.utils.cpp_extension as cpp_ext

    cpp_ext.CUDA_HOME = cuda_home
    return True, f"CUDA {torch.version.cuda} with nvcc from {cuda_home}"


def cuda_arch_list():
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}.{minor}"
    else:
        arch = DEFAULT_ARCH_LIST
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    return arch


def nvidia_wheel_include_flags():
    """The nvidia-* wheels torch depends on carry headers (cuBLAS, cuSPARSE...)
    that a bare toolkit may lack; ATen's CUDA headers include some of them.
    They are searched as system headers, after every -I folder and so after
    the toolkit's own: the wheels also carry the CUDA runtime's and CCCL's
    headers, of the CUDA torch was built with (13.2 for torch 2.15), which
    nvcc refuses beside its own where the two differ ("CUDA compiler and
    CUDA toolkit headers are incompatible")."""
    found = []
    for path in sys.path:
        found += glob.glob(os.path.join(path, "nvidia", "cu*", "include"))
        found += glob.glob(os.path.join(path, "nvidia", "*", "include"))
    return [flag for folder in sorted({p for p in found if os.path.isdir(p)}) for flag in ("-isystem", folder)]


def torch_requirement():
    """The extension is built against this torch's C++ ABI, which changes from
    one minor version to the next: the wheel asks for the same minor, so that
    pip refuses (or replaces) another torch rather than the import failing."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    # .0a0: a pre-release or source build of that minor (2.14.0a0+git...) is in it.
    return f"torch>={major}.{minor}.0a0,<{major}.{minor + 1}.0a0"


def extensions():
    debug = os.environ.get("DEBUG", "0") == "1"
    with_cuda, why = decide_cuda()
    # -g0: Python's own CFLAGS carry -g, whose debug info made 30 of the 32 MB of a
    # CPU-only build (and a third of its compile time).
    cxx_flags = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    # at::parallel_for is a header template: without OpenMP here it runs every
    # kernel on one thread. libgomp is the one torch already loaded.
    cxx_flags += ["-fdiagnostics-color=always", "-fopenmp"]
    sources = sorted(glob.glob(os.path.join(CSRC, "*.cpp")) + glob.glob(os.path.join(CSRC, "cpu", "*.cpp"))
                     + glob.glob(os.path.join(CSRC, "autograd", "*.cpp")))
    include_dirs = [os.path.join(ROOT, CSRC)]
    extra = {"cxx": cxx_flags}
    if with_cuda:
        arch = cuda_arch_list()
        sources += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cu")))
        nvcc_flags = ["-O0", "-g", "-lineinfo"] if debug else ["-O3", "-lineinfo"]
        wheel_includes = nvidia_wheel_include_flags()
        nvcc_flags += ["--expt-relaxed-constexpr", *wheel_includes]
        extra["nvcc"] = nvcc_flags
        extra["cxx"] = cxx_flags + ["-DWITH_CUDA", *wheel_includes]
        say(f"building CPU and CUDA kernels ({why}; TORCH_CUDA_ARCH_LIST={arch}; {'debug' if debug else '-O3'})")
        ext_cls = CUDAExtension
    else:
        say(f"building CPU kernels only ({why}; {'debug' if debug else '-O3'})")
        ext_cls = CppExtension
    return [
        ext_cls(
            name="torch_masked._C",
            sources=sources,
            include_dirs=include_dirs,
            extra_compile_args=extra,
            extra_link_args=["-fopenmp"],
        )
    ]


class BuildKeepingObjects(BuildExtension):
    """Compiles into build/objects-<python>-torch<version>-<cpu|cuda>/ in the
    tree, whatever the command, so that ninja recompiles only what changed:
    an editable install would otherwise compile everything afresh in a
    temporary folder each time, and a wheel built after it would compile it
    all again."""

    def finalize_options(self):
        super().finalize_options()
        torch_version = ".".join(torch.__version__.split(".")[:2])
        kind = "cuda" if any("nvcc" in ext.extra_compile_args for ext in self.extensions) else "cpu"
        self.build_temp = os.path.join(ROOT, "build", f"objects-py{sys.version_info.major}{sys.version_info.minor}"
                                                      f"-torch{torch_version}-{kind}")


setup(
    install_requires=[torch_requirement()],
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildKeepingObjects.with_options(use_ninja=True)},
)
