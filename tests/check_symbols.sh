# check_symbols.sh LIB — every symbol libhyperpar.a exports starts with hp_ (public) or hp__ (internal), so the
# library can be linked beside any other (STYLE.md, "Names"). OpenMP's named critical sections
# (`#pragma omp critical(hp_...)`) export their lock as .gomp_critical_user_<name>, and AddressSanitizer marks
# each exported variable with __odr_asan.<name>: those names must be ours too.
set -u
lib="$1"
command -v nm >/dev/null || { echo "nm not found"; exit 1; }
syms=$(nm -g --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u)
[ -n "$syms" ] || { echo "no symbols read from $lib"; exit 1; }
bad=$(grep -v -e '^hp_' -e '^\.gomp_critical_user_hp_' -e '^__odr_asan\.hp_' <<<"$syms")
if [ -n "$bad" ]; then
    echo "symbols of $lib without the hp_ prefix:"
    echo "$bad"
    exit 1
fi
echo "$(wc -l <<<"$syms") exported symbols, all hp_ or hp__"
