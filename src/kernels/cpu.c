/*
 * cpu.c — which vector instructions this process may use, from cpuid and the OS's saved-register state
 * (XCR0): a CPU can have AVX-512 that a kernel or hypervisor does not save, and then it must not be used.
 * Also the thread setter: oneDNN and the kernels share the process's OpenMP (libgomp) pool.
 *
 *   feature       cpuid                    XCR0 bits that must be set
 *   avx2, fma     7.0:EBX[5], 1:ECX[12]    1, 2        (SSE, AVX state)
 *   avx512f, bw   7.0:EBX[16], EBX[30]     1, 2, 5-7   (+ opmask, ZMM upper halves, ZMM16-31)
 *   avx512_bf16   7.1:EAX[5]               as avx512f
 *   amx_bf16/tile 7.0:EDX[22], EDX[24]     17, 18      (tile config and data)
 *
 * Linux also wants a per-process permission request before the first AMX instruction; we only report AMX
 * (oneDNN asks for it itself when it uses AMX).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "kernels/linalg_int.h"

#include <stdatomic.h>

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static hp__cpu detected;
static pthread_once_t detected_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
    hp__cpu *cpu = &detected;
    memset(cpu, 0, sizeof *cpu);
    unsigned a, b, c, d, max_leaf = (unsigned)__get_cpuid_max(0, NULL);
    if (max_leaf < 1) return;
    __cpuid(1, a, b, c, d);
    bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1;
    uint64_t x = osxsave ? xcr0() : 0;
    bool ymm_os = (x & 0x6) == 0x6, zmm_os = (x & 0xe6) == 0xe6, amx_os = (x & 0x60000) == 0x60000;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        cpu->avx2 = ymm_os && ((b >> 5) & 1);
        cpu->fma = ymm_os && fma;
        cpu->avx512f = zmm_os && ((b >> 16) & 1);
        cpu->avx512bw = zmm_os && ((b >> 30) & 1);
        cpu->amx_bf16 = amx_os && ((d >> 22) & 1);
        cpu->amx_tile = amx_os && ((d >> 24) & 1);
        unsigned sub_max = a;
        if (sub_max >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            cpu->avx512_bf16 = zmm_os && ((a >> 5) & 1);
        }
    }
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++) __cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
        memcpy(cpu->brand, r, 48);
        cpu->brand[48] = '\0';
        /* The name is padded with spaces (leading on some Intel parts, trailing on AMD). */
        char *s = cpu->brand;
        while (*s == ' ') s++;
        memmove(cpu->brand, s, strlen(s) + 1);
        for (size_t n = strlen(cpu->brand); n > 0 && cpu->brand[n - 1] == ' '; n--) cpu->brand[n - 1] = '\0';
    }
}

/* cpuid once per process (the answer cannot change while it runs); every caller, on any thread, reads that. */
void hp__cpu_detect(hp__cpu *cpu)
{
    pthread_once(&detected_once, detect);
    *cpu = detected;
}

bool hp__isa_available(hp__isa isa)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    switch (isa) {
    case HP__ISA_PORTABLE: return true;
    case HP__ISA_AVX2: return cpu.avx2 && cpu.fma;
    case HP__ISA_AVX512: return cpu.avx512f && cpu.avx2 && cpu.fma;
    default: return false;
    }
}

const char *hp__isa_name(hp__isa isa)
{
    switch (isa) {
    case HP__ISA_PORTABLE: return "portable C";
    case HP__ISA_AVX2: return "avx2+fma";
    case HP__ISA_AVX512: return "avx512f";
    default: return "?";
    }
}

hp__isa hp__isa_best(void)
{
    if (hp__isa_available(HP__ISA_AVX512)) return HP__ISA_AVX512;
    if (hp__isa_available(HP__ISA_AVX2)) return HP__ISA_AVX2;
    return HP__ISA_PORTABLE;
}

hp__isa hp__isa_cached(_Atomic int *slot)
{
    int v = atomic_load_explicit(slot, memory_order_relaxed);
    if (!v) {
        v = 1 + (int)hp__isa_best();
        atomic_store_explicit(slot, v, memory_order_relaxed);
    }
    return (hp__isa)(v - 1);
}

void hp__isa_force(_Atomic int *slot, hp__isa isa) { atomic_store_explicit(slot, 1 + (int)isa, memory_order_relaxed); }

const char *hp_linalg_cpu_isa(char *buf, size_t cap)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    const struct {
        bool on;
        const char *name;
    } f[] = {{cpu.avx2, "avx2"},         {cpu.fma, "fma"},           {cpu.avx512f, "avx512f"},
             {cpu.avx512bw, "avx512bw"}, {cpu.avx512_bf16, "avx512_bf16"}, {cpu.amx_bf16, "amx_bf16"},
             {cpu.amx_tile, "amx_tile"}};
    size_t len = 0;
    if (cap > 0) buf[0] = '\0';
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].on || len >= cap) continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? " " : "", f[i].name);
        if (w > 0) len += (size_t)w;
    }
    return buf;
}

int hp_linalg_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return omp_get_num_procs() > 0 ? omp_get_num_procs() : 1;
}

int hp_linalg_set_threads(int n)
{
    if (n > 0) omp_set_num_threads(n);
    return omp_get_max_threads();
}
