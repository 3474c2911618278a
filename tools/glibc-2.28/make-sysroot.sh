#!/usr/bin/env bash
# The glibc 2.28 target that tools/glibc-2.28/gcc and g++ compile and link against, so that the host's GCC (and
# nvcc with it as host compiler) builds a libselscan.so that loads on glibc 2.28 (manylinux_2_28: RHEL/Rocky 8,
# Ubuntu 20.04 has 2.31). zig (PyPI `ziglang`) is the source: it ships glibc's headers with version guards
# (selected by -D__GLIBC_MINOR__=28) and generates link stubs whose symbols carry only versions up to
# GLIBC_2.28, plus libc_nonshared.a. Nothing here is hand-written glibc: two overlay headers and one object
# bridge GCC's libstdc++, which this machine built against a newer glibc (docs/building.md, "manylinux_2_28").
#
# Usage: tools/glibc-2.28/make-sysroot.sh PYTHON [DIR]
#   PYTHON  a python with ziglang installed (tools/build-wheel.sh passes its build/wheel-tools venv's)
#   DIR     where to build it (default build/toolchains/glibc-2.28; the wrappers read SELSCAN_GLIBC_SYSROOT)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${1:?usage: make-sysroot.sh PYTHON [DIR]}
DIR=${2:-$PWD/build/toolchains/glibc-2.28}
case "$DIR" in /*) ;; *) DIR=$PWD/$DIR ;; esac
CC=${SELSCAN_HOST_CC:-gcc}
CXX=${SELSCAN_HOST_CXX:-g++}

zig_lib=$("$PYTHON" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "lib"))')
rm -rf "$DIR"
mkdir -p "$DIR/include" "$DIR/overlay/sys" "$DIR/overlay/bits" "$DIR/lib"

# glibc's headers as zig lays them out for x86_64-linux-gnu (zig's own `-isystem` order, also used below).
headers=(x86-linux-gnu generic-glibc x86-linux-any any-linux-any)
for h in "${headers[@]}"; do cp -r "$zig_lib/libc/include/$h" "$DIR/include/$h"; done

# Link stubs: zig generates them (and libc_nonshared.a) when it first links against this glibc version; a private
# cache makes them easy to find.
probe=$DIR/.probe
mkdir -p "$probe"
echo 'int selscan_probe(void) { return 0; }' > "$probe/probe.c"
ZIG_GLOBAL_CACHE_DIR=$probe/cache ZIG_LOCAL_CACHE_DIR=$probe/cache \
  "$PYTHON" -m ziglang cc -target x86_64-linux-gnu.2.28 -shared -fPIC "$probe/probe.c" -o "$probe/probe.so" \
  -lm -lpthread -ldl -lrt
for f in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libld.so.2 libc_nonshared.a; do
  src=$(find "$probe/cache" -name "$f" -type f | head -1)
  if [ -z "$src" ]; then echo "make-sysroot: zig produced no $f" >&2; exit 1; fi
  cp "$src" "$DIR/lib/$f"
done
mv "$DIR/lib/libld.so.2" "$DIR/lib/ld-linux-x86-64.so.2"
rm -rf "$probe"
# What -lc, -lm, ... find first (the wrappers put DIR/lib before the system's directories): glibc's own layout.
L=$DIR/lib
echo "GROUP ( $L/libc.so.6 $L/libc_nonshared.a AS_NEEDED ( $L/ld-linux-x86-64.so.2 ) )" > "$L/libc.so"
for n in m.so.6 pthread.so.0 dl.so.2 rt.so.1; do echo "GROUP ( $L/lib$n )" > "$L/lib${n%%.so*}.so"; done
newest=$(readelf -V -W "$L/libc.so.6" | grep -oE 'GLIBC_2\.[0-9]+' | sort -uV | tail -1)
if [ "$newest" != GLIBC_2.28 ]; then echo "make-sysroot: stub libc.so.6 goes up to $newest, not GLIBC_2.28" >&2; exit 1; fi

# GCC 11+'s libstdc++ reads glibc 2.32's __libc_single_threaded (through <sys/single_threaded.h> when it exists,
# and in the objects of its static libstdc++.a) to skip atomic reference counting in single-threaded programs. A
# 2.28 glibc has no such variable, so the library carries its own, hidden, always 0 ("threads may exist"): the
# atomic paths, which are always correct.
cat > "$DIR/overlay/sys/single_threaded.h" <<'EOF'
/* glibc 2.32's flag for a libstdc++ built on a 2.28 target: defined (hidden, always 0) in single_threaded.o. */
#ifndef _SYS_SINGLE_THREADED_H
#define _SYS_SINGLE_THREADED_H 1
#ifdef __cplusplus
extern "C" {
#endif
extern char __libc_single_threaded;
#ifdef __cplusplus
}
#endif
#endif
EOF
echo '__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;' > "$DIR/lib/single_threaded.c"
"$CC" -O2 -fPIC -c "$DIR/lib/single_threaded.c" -o "$DIR/lib/single_threaded.o"

# zig's headers are the newest glibc's with version guards where symbols were added, but C23's math functions
# (cospi, sinpi, rsqrt, ..., glibc 2.41-2.42) are declared whatever __GLIBC_MINOR__ says. CUDA's math_functions.h
# declares its own for a glibc that lacks them, and nvcc rejects the two declarations together. glibc 2.28's
# headers declare none of them: the overlay copy turns that group off below 2.41.
pattern='^#if __GLIBC_USE \(IEC_60559_FUNCS_EXT\) \|\| __GLIBC_USE \(ISOC23\)$'
src=$DIR/include/generic-glibc/bits/libc-header-start.h
if [ "$(grep -cE "$pattern" "$src")" != 1 ]; then
  echo "make-sysroot: $src no longer has the C23 math guard this script expects (ziglang changed?)" >&2; exit 1
fi
sed -E "s/$pattern/#if (__GLIBC_USE (IEC_60559_FUNCS_EXT) || __GLIBC_USE (ISOC23)) \\&\\& __GLIBC_MINOR__ >= 41/" \
  "$src" > "$DIR/overlay/bits/libc-header-start.h"

# The compiler's own header directories (libstdc++, GCC's builtin headers), in its order, without the system's
# glibc directories, which the target's replace.
search_dirs() {
  echo | "$1" -x "$2" -E -v - 2>&1 | sed -n '/#include <...> search starts here/,/End of search list/p' |
    sed '1d;$d;s/^ *//' | grep -v -E "^(/usr/local/include|/usr/include|/usr/include/$("$1" -print-multiarch))$"
}
search_dirs "$CXX" c++ > "$DIR/cxx-dirs"
search_dirs "$CC" c > "$DIR/c-dirs"
printf '%s\n' "${headers[@]}" > "$DIR/target-dirs"
echo "make-sysroot: glibc 2.28 target in $DIR ($(du -sh "$DIR" | cut -f1)); host compiler: $("$CXX" --version | head -1)"
