#!/usr/bin/env bash
# The one-call GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit,
# NCCL (the nvidia-nccl Python package will do) and no Debian packages.
#
# Before (on the Debian build machine):  bash bench/gpu-deps.sh
#   -> .deps/root holds accumd's libraries, meson and pkgconf, unpacked from .debs.
# Then, on the GPU machine, in the repository root, carrying .deps:
#   bash bench/gpu-check.sh            (about 8 minutes at most)
#
# It builds with -Dcuda=enabled, runs the GPU tests (CUDA kernels and training
# against the CPU reference), then the GPU benchmarks, and prints a short
# table last. Output files go to $OUT when set (the device tool), else bench/out.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
R=$top/.deps/root
OUTDIR=${OUT:-$top/bench/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu-check.log
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
rows=()
row() { rows+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }

[ -d "$R" ] || { say "no .deps/root: run bench/gpu-deps.sh on the build machine and carry .deps"; exit 2; }

# --- environment: carried libraries first, the toolkit, NCCL
export PYTHONPATH=$R/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}
export PKG_CONFIG_LIBDIR=$R/usr/lib/x86_64-linux-gnu/pkgconfig:$R/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$R/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$R
export PKG_CONFIG=$R/usr/bin/pkgconf
export LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
[ -n "$nvcc" ] || { say "no nvcc on this machine"; exit 2; }
cudaroot=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null ||
       python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
if [ -z "$nccl" ] && [ -f "$cudaroot/include/nccl.h" ]; then nccl=""; fi
export LD_LIBRARY_PATH=$cudaroot/lib64${nccl:+:$nccl/lib}:$LD_LIBRARY_PATH
meson=(python3 "$R/usr/bin/meson")
say "== $(date -u +%FT%TZ) gpu-check on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "   nvcc $("$nvcc" --version | tail -1), cuda root $cudaroot, nccl ${nccl:-in toolkit}"

# --- build
build=$top/build/gpu
t0=$(date +%s)
if "${meson[@]}" setup --wipe "$build" -Dcuda=enabled -Dbuildtype=release -Dtests=true \
        -Dcudatoolkit="$cudaroot" ${nccl:+-Dnccl_dir="$nccl"} >>"$LOG" 2>&1 &&
   ninja -C "$build" -j16 >>"$LOG" 2>&1; then
    row "build (-Dcuda=enabled)" ok "$(( $(date +%s) - t0 )) s"
else
    row "build (-Dcuda=enabled)" FAIL "see gpu-check.log"
    tail -30 "$LOG"
    printf '%s\n' "${rows[@]}"
    exit 1
fi

# --- GPU tests: CUDA vs CPU reference
t0=$(date +%s)
timeout 240 "${meson[@]}" test -C "$build" --suite gpu --print-errorlogs >>"$LOG" 2>&1
rc=$?
summary=$(grep -E '^(Ok|Fail|Skipped|Timeout):' "$build/meson-logs/testlog.txt" 2>/dev/null | tr -s ' ' | tr '\n' ' ')
row "GPU tests (suite gpu)" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$summary($(( $(date +%s) - t0 )) s)"
cp "$build/meson-logs/testlog.txt" "$OUTDIR/gpu-tests.txt" 2>/dev/null

# --- benchmarks: each prints "RESULT key value" lines
for b in "$build"/bench/bench_gpu*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    t0=$(date +%s)
    timeout 200 "$b" >"$OUTDIR/$name.txt" 2>&1
    rc=$?
    cat "$OUTDIR/$name.txt" >>"$LOG"
    while read -r _ key val; do row "$name $key" "" "$val"; done < <(grep '^RESULT ' "$OUTDIR/$name.txt")
    [ $rc -eq 0 ] || row "$name" FAIL "exit $rc"
done
[ -n "$(ls "$build"/bench/bench_gpu* 2>/dev/null)" ] || row "GPU benchmarks" none "no bench_gpu* programs built yet"

say ""
say "== gpu-check summary ($(date -u +%F))"
printf '%s\n' "${rows[@]}" | tee -a "$LOG"
