"""Installs the package in development mode from a cdylib cargo already built.

    python python/develop.py [target/debug]

copies `lib_wgvae.so` (`_wgvae.dll` / `lib_wgvae.dylib`) from the cargo
target folder to `python/wgvae/_wgvae.abi3.so` (`.pyd` on Windows) and puts
`python/` on the running interpreter's path with a `.pth` file, as
`maturin develop` does, without building again: a quick loop after
`cargo test --workspace` built the library with the tests' features (a maturin
build resolves features for this crate alone, no dev-dependencies, and
recompiles most of the dependency graph). CI tests the maturin wheel instead
(ci/test.sh's python step, docs/release.md); `pip install ./python` is the
ordinary source install.
"""

import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main():
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "target" / "debug"
    names = {"win32": ("_wgvae.dll", "_wgvae.pyd"), "darwin": ("lib_wgvae.dylib", "_wgvae.abi3.so")}
    built, installed = names.get(sys.platform, ("lib_wgvae.so", "_wgvae.abi3.so"))
    src = target / built
    if not src.exists():
        sys.exit(f"{src} not found: build it first (cargo build -p wgvae-py, or cargo test --workspace)")
    dst = HERE / "wgvae" / installed
    shutil.copyfile(src, dst)
    pth = Path(sysconfig.get_paths()["purelib"]) / "wgvae-develop.pth"
    pth.write_text(str(HERE) + "\n")
    print(f"installed {src} as {dst}; {pth} → {HERE}")


if __name__ == "__main__":
    main()
