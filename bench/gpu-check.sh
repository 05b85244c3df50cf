#!/usr/bin/env bash
# The one-call GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit,
# NCCL (the nvidia-nccl Python package will do) and no Debian packages.
#
# Before (on the Debian build machine):  bash bench/gpu-deps.sh
#   -> .deps/root holds accumd's libraries, meson and pkgconf, unpacked from .debs.
# Then, on the GPU machine, in the repository root, carrying .deps:
#   bash bench/gpu-check.sh            (about 8 minutes at most)
#
# It builds with -Dcuda=enabled, runs the GPU tests (CUDA kernels, the model
# and the whole trainer against the CPU reference, NCCL), then the GPU
# benchmarks, then the daemon itself with devices = cuda (bench/gpu-daemon.py:
# an fp32 and a bf16 job over HTTP), and prints a short table last. Output files go to $OUT when set (the device tool), else bench/out.
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
# the nvidia-nccl wheel ships lib/libnccl.so.2 only; the linker wants libnccl.so
if [ -n "$nccl" ] && [ ! -e "$nccl/lib/libnccl.so" ] && [ -e "$nccl/lib/libnccl.so.2" ]; then
    shim=$(mktemp -d /tmp/accumd-nccl.XXXXXX) # outside the tree: meson refuses in-tree absolute include dirs
    mkdir -p "$shim/lib"
    ln -s "$nccl/include" "$shim/include"
    ln -s "$nccl/lib/libnccl.so.2" "$shim/lib/libnccl.so"
    ln -s "$nccl/lib/libnccl.so.2" "$shim/lib/libnccl.so.2"
    nccl=$shim
fi
export LD_LIBRARY_PATH=$cudaroot/lib64${nccl:+:$nccl/lib}:$LD_LIBRARY_PATH
# meson: the machine's own when it has one (the GPU image ships it), else the carried .deb's
if command -v meson >/dev/null 2>&1 && meson --version >/dev/null 2>&1; then meson=(meson)
else meson=(python3 "$R/usr/bin/meson"); fi
say "== $(date -u +%FT%TZ) gpu-check on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "   nvcc $("$nvcc" --version | tail -1), cuda root $cudaroot, nccl ${nccl:-in toolkit}"

# --- build
build=$top/build/gpu
t0=$(date +%s)
rm -rf "$build" # a fresh tree: meson's --wipe refuses a directory that is not a build yet
if "${meson[@]}" setup "$build" -Dcuda=enabled -Dbuildtype=release -Dtests=true \
        -Dcudatoolkit="$cudaroot" ${nccl:+-Dnccl_dir="$nccl"} >>"$LOG" 2>&1 &&
   ninja -C "$build" -j16 >>"$LOG" 2>&1; then
    row "build (-Dcuda=enabled)" ok "$(( $(date +%s) - t0 )) s"
else
    row "build (-Dcuda=enabled)" FAIL "see gpu-check.log"
    tail -30 "$LOG"
    printf '%s\n' "${rows[@]}"
    exit 1
fi

# --- libraries: everything the daemon needs resolves (carried .debs, toolkit, NCCL)
missing=$(ldd "$build/accumd" "$build"/tests/test_gpu_cuda_trainer 2>&1 | grep 'not found' | sort -u | tr -s ' \t' ' ')
if [ -n "$missing" ]; then row "shared libraries" FAIL "$missing"; else row "shared libraries" ok "all resolve"; fi

# --- GPU tests: CUDA vs CPU reference, each on its own with its own limit, so
# one that hangs (a collective) costs its limit, not the rest of the check
for exe in "$build"/tests/test_gpu_*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    t=${exe##*/test_gpu_}
    t0=$(date +%s)
    timeout 90 "$exe" >"$OUTDIR/gpu_$t.txt" 2>&1
    rc=$?
    cat "$OUTDIR/gpu_$t.txt" >>"$LOG"
    case $rc in
        0) verdict=ok ;;
        77) verdict=SKIPPED ;; # on the GPU machine: the GPU was not seen
        124) verdict=TIMEOUT ;;
        *) verdict=FAIL ;;
    esac
    last=$(grep -v '^$' "$OUTDIR/gpu_$t.txt" | tail -1 | cut -c1-70)
    row "gpu_$t" "$verdict" "$(( $(date +%s) - t0 )) s: $last"
done

# --- benchmarks: each prints "RESULT key value" lines
for b in "$build"/bench/bench_gpu*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    name=$(basename "$b")
    t0=$(date +%s)
    timeout 150 "$b" >"$OUTDIR/$name.txt" 2>&1
    rc=$?
    cat "$OUTDIR/$name.txt" >>"$LOG"
    while read -r _ key val; do row "$name $key" "" "$val"; done < <(grep '^RESULT ' "$OUTDIR/$name.txt")
    if [ $rc -ne 0 ]; then row "$name" FAIL "exit $rc"
    elif ! grep -q '^RESULT ' "$OUTDIR/$name.txt"; then row "$name" "" "$(head -1 "$OUTDIR/$name.txt")"; fi
done
[ -n "$(ls "$build"/bench/bench_gpu* 2>/dev/null)" ] || row "GPU benchmarks" none "no bench_gpu* programs built yet"

# --- the daemon itself on the GPU: devices = cuda, jobs over HTTP (fp32, bf16)
t0=$(date +%s)
dstate=$(mktemp -d /tmp/accumd-gpu-check.XXXXXX)
timeout 200 python3 "$top/bench/gpu-daemon.py" "$build/accumd" "$top" "$dstate" >"$OUTDIR/gpu-daemon.txt" 2>&1
rc=$?
cat "$OUTDIR/gpu-daemon.txt" >>"$LOG"
cp "$dstate/daemon.log" "$OUTDIR/gpu-daemon-accumd.log" 2>/dev/null
while read -r _ key val; do row "$key" "" "$val"; done < <(grep '^RESULT ' "$OUTDIR/gpu-daemon.txt")
row "daemon on GPU (devices = cuda)" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(( $(date +%s) - t0 )) s"

say ""
say "== gpu-check summary ($(date -u +%F))"
printf '%s\n' "${rows[@]}" | tee -a "$LOG"
