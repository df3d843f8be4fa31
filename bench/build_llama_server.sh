#!/usr/bin/env bash
# Builds llama.cpp's llama-server (the benchmark's reference server) and llama-quantize (which
# bench/make_models.py runs) from the llama.cpp source vendored inside the llama-cpp-python sdist,
# into .cache/llama.cpp/. Nothing of llama.cpp is committed. Idempotent: builds only the binaries
# missing, and does nothing when both exist.
#   bench/build_llama_server.sh            # then `make bench` finds it
#   JOBS=4 bench/build_llama_server.sh     # more parallel jobs (default 2)
#   LLAMA_ISA=avx2 bench/build_llama_server.sh
#       # for AVX2 + FMA only (no AVX-512), into build-<version>-avx2: an AVX-512 machine's stand-in
#       # for an AVX2 one, beside torch's ATEN_CPU_CAPABILITY=avx2 (name it with LLAMA_SERVER=...)
#   LLAMA_ISA=avx512 bench/build_llama_server.sh
#       # AVX-512 (VNNI, bf16) without AMX, into build-<version>-avx512: for an Intel CPU whose
#       # VM does not enable AMX's tile state (the native build then dies with SIGSEGV at start)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
PY="${PY:-.venv/bin/python}"
ROOT="$(pwd)/.cache/llama.cpp"
SRC="$ROOT/llama-cpp-python-$VERSION/vendor/llama.cpp"
ISA="${LLAMA_ISA:-native}"
BUILD="$ROOT/build-$VERSION"
ISA_FLAGS=()
case "$ISA" in
    native) ;;
    avx2)
        BUILD="$BUILD-avx2"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
                   -DGGML_AVX_VNNI=OFF)
        ;;
    avx512)
        BUILD="$BUILD-avx512"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
                   -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
        ;;
    *) echo "LLAMA_ISA must be native, avx2 or avx512, not $ISA" >&2; exit 2 ;;
esac
TARGETS=()
for target in llama-server llama-quantize; do
    if [ -x "$BUILD/bin/$target" ]; then
        echo "$target already built: $BUILD/bin/$target"
    else
        TARGETS+=("$target")
    fi
done
[ "${#TARGETS[@]}" -eq 0 ] && exit 0
mkdir -p "$ROOT"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "downloading the llama-cpp-python==$VERSION sdist"
    "$PY" -m pip download --quiet --no-binary :all: --no-deps --dest "$ROOT" "llama-cpp-python==$VERSION"
    tar -xzf "$ROOT/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT" 2>/dev/null \
        || tar -xzf "$ROOT/llama-cpp-python-$VERSION.tar.gz" -C "$ROOT"
    [ -d "$ROOT/llama-cpp-python-$VERSION" ] || mv "$ROOT/llama_cpp_python-$VERSION" "$ROOT/llama-cpp-python-$VERSION"
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
[ -f "$BUILD/CMakeCache.txt" ] && GEN=()  # configured before: keep its generator
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF \
    "${ISA_FLAGS[@]}"
cmake --build "$BUILD" --config Release --target "${TARGETS[@]}" -j "$JOBS"
for target in "${TARGETS[@]}"; do
    test -x "$BUILD/bin/$target"
    echo "built $BUILD/bin/$target"
done
