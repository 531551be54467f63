"""Runs the test suite's CPU cases against csrc/cuda's kernels, emulated on
the CPU (README.md here):

    python tests/cuda_emulation/run.py [--asan] [pytest arguments]

Each .cu file is compiled as C++ against include/ (fibers for CUDA threads,
stand-ins for the CUDA runtime, c10's CUDA helpers and CUB), under
UndefinedBehaviorSanitizer (every check of -fsanitize=undefined), and
registered as the CPU kernels of torch.ops.masked in place of csrc/cpu's.
Tests of what only csrc/cpu's kernels do are marked cpu_kernel and left out,
and so are those past 2**31 elements (marked large: far too slow emulated).
With --asan, AddressSanitizer also checks every access the kernels make
(compute-sanitizer's memcheck, in effect); the process then runs again with
its runtime preloaded.
"""
import os
import pathlib
import subprocess
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
BUILD = ROOT / "build" / "cuda_emulation"
ASAN = "--asan" in sys.argv[1:]
SANITIZERS = "undefined" + (",address" if ASAN else "")

# (file, text, replacement, why): the few places where the CUDA sources
# depend on running on a GPU. Each text must be found, so that a change to
# the sources that breaks one stops the build here rather than passing it.
ADAPTATIONS = [
    ("cuda/*.cu", "TORCH_LIBRARY_IMPL(masked, CUDA, m)", "TORCH_LIBRARY_IMPL(masked, CPU, m)",
     "the kernels serve the CPU dispatch key, in place of csrc/cpu's"),
    ("common.h", "t.is_cuda() || element_size == 16", "true",
     "every tensor is a device tensor: data aligned to its element size"),
    ("common.h", "return at::detail::empty_cpu(shape, options);",
     "return ::cuda_emulation::filled_with_garbage(at::detail::empty_cpu(shape, options));",
     "new device memory holds old data, not the zeros of fresh host pages"),
    ("cuda/scatter_nd_kernel.cu", "at::kCUDA", "at::kCPU", "scratch memory on the device"),
    ("cuda/host_read.cuh", "/*pin_memory=*/true", "/*pin_memory=*/false",
     "pinned host memory needs a GPU; the emulated copy is a memcpy either way"),
]


def convert_launches(text):
    """kernel<<<config>>>(args) -> cuda_emulation::launch(LaunchConfig(config), [&] { kernel(args); }),
    for launches that start their line, as csrc/cuda's do."""
    pieces = []
    done = 0
    while (start := text.find("<<<", done)) >= 0:
        statement = text.rfind("\n", 0, start) + 1
        statement += len(text[statement:start]) - len(text[statement:start].lstrip())
        config_end = text.index(">>>(", start)
        depth, end = 0, config_end + 3
        while True:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
            end += 1
        kernel, config, args = text[statement:start], text[start + 3:config_end], text[config_end + 4:end]
        pieces += [text[done:statement],
                   f"::cuda_emulation::launch(::cuda_emulation::LaunchConfig({config}), [&] {{ {kernel}({args}); }})"]
        done = end + 1
    return "".join(pieces + [text[done:]])


def generate_sources(out):
    """csrc's headers and CUDA sources, adapted, under `out`; returns the .cpp files."""
    csrc = ROOT / "csrc"
    files = sorted(csrc.glob("*.h")) + sorted((csrc / "cuda").glob("*.cuh")) + sorted((csrc / "cuda").glob("*.cu"))
    unused = set(range(len(ADAPTATIONS)))
    sources = []
    for path in files:
        relative = path.relative_to(csrc).as_posix()
        text = path.read_text()
        for number, (pattern, old, new, _) in enumerate(ADAPTATIONS):
            if pathlib.PurePosixPath(relative).match(pattern) and old in text:
                text = text.replace(old, new)
                unused.discard(number)
        if path.suffix in (".cu", ".cuh"):
            text = convert_launches(text)
        target = out / (relative[:-3] + ".cpp" if path.suffix == ".cu" else relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:  # unchanged files keep ninja's timestamps
            target.write_text(text)
        if path.suffix == ".cu":
            sources.append(str(target))
    missing = [f"{pattern}: {old!r} ({why})" for number, (pattern, old, _, why) in enumerate(ADAPTATIONS)
               if number in unused]
    if missing:
        sys.exit("cuda emulation: csrc no longer has what these adaptations replace:\n  " + "\n  ".join(missing))
    return sources


def rerun_with_asan_preloaded():
    """AddressSanitizer's runtime must come first (and libstdc++ before any
    library throws), which only a new process can arrange."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    libraries = [subprocess.check_output(["c++", f"-print-file-name={name}"], text=True).strip()
                 for name in ("libasan.so", "libstdc++.so.6")]
    env = dict(os.environ, LD_PRELOAD=" ".join(libraries), ASAN_OPTIONS="detect_leaks=0")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def load_emulated_kernels(build):
    sys.path.insert(0, str(ROOT))  # this checkout's package, built in place or installed
    import torch_masked  # noqa: F401  csrc/cpu's kernels first, replaced below
    from torch.utils.cpp_extension import load

    sources = generate_sources(build / "src")
    flags = [
        "-O1",
        "-Wno-unknown-pragmas",
        "-include", "cuda_emulation.h",
        # Its own names: the package's inline helpers are compiled here with
        # the adaptations above, and must not be confused with _C's.
        "-Dtorch_masked=torch_masked_cuda_emulation",
        f"-fsanitize={SANITIZERS}",
        f"-fno-sanitize-recover={SANITIZERS}",
    ]
    with warnings.catch_warnings():
        # Registering over csrc/cpu's kernels is the point; torch warns of it.
        warnings.simplefilter("ignore")
        load(name="torch_masked_cuda_emulation", sources=sources + [str(HERE / "runtime.cpp")],
             extra_cflags=flags, extra_ldflags=[f"-fsanitize={SANITIZERS}"],
             extra_include_paths=[str(HERE / "include"), str(build / "src")],
             build_directory=str(build), is_python_module=False)


def main():
    import pytest

    if ASAN:
        rerun_with_asan_preloaded()
    build = BUILD / "asan" if ASAN else BUILD
    build.mkdir(parents=True, exist_ok=True)
    load_emulated_kernels(build)
    os.chdir(ROOT)
    # With no paths among the arguments, pytest takes pyproject.toml's testpaths.
    arguments = [a for a in sys.argv[1:] if a != "--asan"]
    if ASAN:
        # AddressSanitizer reports on file descriptor 2 and ends the process:
        # pytest must not be holding that descriptor's output when it does.
        arguments.insert(0, "--capture=sys")
    return pytest.main(["-p", "no:cacheprovider", "-m", "not cuda and not cpu_kernel and not large and not deployment and not static", *arguments])


if __name__ == "__main__":
    sys.exit(main())
