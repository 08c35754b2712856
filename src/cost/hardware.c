/*
 * hardware.c — the machines `hyperpar cost` and `hyperpar advise` can describe (docs/cost.md, "Hardware
 * profiles"): hyperpar's own f32 CPU runtime, and GPUs whose figures are estimates for another engine.
 *
 * Every GPU figure is the vendor's published one (the source names the datasheet); bandwidths are per device and
 * per direction (NVIDIA's "900 GB/s NVLink" and AMD's 7 x 128 GB/s Infinity Fabric are both-directions sums, so
 * half of them is used), memory is the datasheet's size read in GiB (an "80GB" H100 holds 80 GiB of HBM3).
 * Latencies are not on datasheets: they are stated assumptions (a few µs inside a node, NCCL's order; more over
 * the network).
 *
 * No step reaches a datasheet's rate, so each GPU states two efficiencies (docs/cost.md "Efficiencies"): the
 * fraction of the bf16 peak a training step's GEMMs sustain, the best-shape matmul efficiency that Bekman's
 * "Maximum Achievable Matmul FLOPS" table measured (stas00/ml-engineering, compute/accelerator) less about five
 * points for the sustained clock and the step's less favourable shapes (that margin is an assumption); and the
 * fraction of the link bandwidth a collective reaches (0.8, NCCL's bus bandwidth against the nominal one: an
 * assumption, no measurement of the project's). The cpu profile's rates are hyperpar bench's measurements, so its
 * efficiencies are 1.
 */
#include "hyperpar/cost.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define GIB ((uint64_t)1 << 30)

static const hp_cost_hardware g_hw[] = {
    /* hbm_bw: decode's memory bandwidth on a CPU rank, 10 GB/s, what one core of this project's 2-core machines
     * moved with memcpy (7.3 to 12.4 GB/s, read + write, while shared), far below a DDR4 socket's peak: a rank is a
     * core or two here (docs/cost.md "Decode") */
    {.name = "cpu", .desc = "hyperpar's own f32 runtime on this project's CPUs", .gpu = false, .flops = 100e9,
     .hbm_bw = 10e9, .bw_intra = 10e9, .bw_inter = 1.25e9, .lat_intra = 5e-6, .lat_inter = 20e-6,
     .source = "hyperpar bench run on the project's 2-core AVX2 machines (docs/cost.md)", .gemm_eff = 1, .link_eff = 1,
     .eff_source = "1: the rates are hyperpar bench's measurements, not a datasheet's"},
    {.name = "H100", .desc = "NVIDIA H100 SXM5 80GB", .gpu = true, .mem_bytes = 80 * GIB, .flops = 989e12,
     .hbm_bw = 3.35e12, .bw_intra = 450e9, .bw_inter = 50e9, .lat_intra = 3e-6, .lat_inter = 10e-6,
     .ranks_per_node = 8,
     .source = "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOP/s BF16 dense, 3.35 TB/s HBM3, NVLink 900 "
               "GB/s both directions; DGX H100: 8 GPUs, one 400 Gb/s ConnectX-7 port per GPU",
     .gemm_eff = 0.75, .link_eff = 0.8,
     .eff_source = "GEMM 0.75: H100 SXM's best-shape bf16 matmul reached 80.3% of 989 TFLOP/s (Bekman, ml-engineering, "
                   "MAMF table), less 5 points for a step's shapes (assumption); links 0.8 (assumption: NCCL bus "
                   "bandwidth against nominal)"},
    {.name = "H200", .desc = "NVIDIA H200 SXM 141GB", .gpu = true, .mem_bytes = 141 * GIB, .flops = 989e12,
     .hbm_bw = 4.8e12, .bw_intra = 450e9, .bw_inter = 50e9, .lat_intra = 3e-6, .lat_inter = 10e-6,
     .ranks_per_node = 8,
     .source = "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s BF16 dense, "
               "NVLink 900 GB/s both directions; HGX H200: 8 GPUs, 400 Gb/s per GPU",
     .gemm_eff = 0.75, .link_eff = 0.8,
     .eff_source = "GEMM 0.75: the H100's (the same GH100 die and 989 TFLOP/s; GH200 reached 83.6% in Bekman's MAMF "
                   "table), less 5 points for a step's shapes (assumption); links 0.8 (assumption)"},
    {.name = "A100", .desc = "NVIDIA A100 SXM4 80GB", .gpu = true, .mem_bytes = 80 * GIB, .flops = 312e12,
     .hbm_bw = 2.0e12, .bw_intra = 300e9, .bw_inter = 25e9, .lat_intra = 3e-6, .lat_inter = 10e-6,
     .ranks_per_node = 8,
     .source = "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOP/s BF16 dense, 2,039 GB/s HBM2e, "
               "NVLink 600 GB/s both directions; DGX A100: 8 GPUs, one 200 Gb/s HDR port per GPU",
     .gemm_eff = 0.8, .link_eff = 0.8,
     .eff_source = "GEMM 0.8: A100 SXM's best-shape bf16 matmul reached 86.9% of 312 TFLOP/s (Bekman, ml-engineering, "
                   "MAMF table), less 5 points for a step's shapes (assumption); links 0.8 (assumption)"},
    {.name = "MI300X", .desc = "AMD Instinct MI300X 192GB", .gpu = true, .mem_bytes = 192 * GIB, .flops = 1307e12,
     .hbm_bw = 5.3e12, .bw_intra = 448e9, .bw_inter = 50e9, .lat_intra = 3e-6, .lat_inter = 10e-6,
     .ranks_per_node = 8,
     .source = "AMD Instinct MI300X data sheet: 1307.4 TFLOP/s BF16 dense, 192 GB HBM3, 5.3 TB/s, Infinity Fabric "
               "7 links x 128 GB/s = 896 GB/s both directions; 8-GPU platform, 400 Gb/s per GPU",
     .gemm_eff = 0.55, .link_eff = 0.8,
     .eff_source = "GEMM 0.55: MI300X's best-shape bf16 matmul reached 60.1% of 1300 TFLOP/s (Bekman, ml-engineering, "
                   "MAMF table, ROCm 6.2), less 5 points for a step's shapes (assumption); links 0.8 (assumption)"},
};

const hp_cost_hardware *hp_cost_hardware_list(size_t *n)
{
    *n = sizeof g_hw / sizeof *g_hw;
    return g_hw;
}

static bool same_ci(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)a[i]) != tolower((unsigned char)b[i])) return false;
    return true;
}

/* name, or name followed by "-<memory>G"/"-<memory>GB" with the profile's memory (H100-80G, A100-80GB). */
const hp_cost_hardware *hp_cost_hardware_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof g_hw / sizeof *g_hw; i++) {
        const hp_cost_hardware *h = &g_hw[i];
        size_t n = strlen(h->name);
        if (strlen(name) < n || !same_ci(name, h->name, n)) continue;
        const char *rest = name + n;
        if (!*rest) return h;
        if (!h->gpu || *rest != '-') continue;
        char want[16];
        int k = snprintf(want, sizeof want, "%llu", (unsigned long long)(h->mem_bytes / GIB));
        rest++;
        if (strncmp(rest, want, (size_t)k)) continue;
        rest += k;
        if (!*rest || same_ci(rest, "G", 2) || same_ci(rest, "GB", 3)) return h;
    }
    return NULL;
}

bool hp_cost_model_gpu(const hp_cost_model *m)
{
    return m->hw && m->hw->gpu;
}

void hp_cost_model_hardware(hp_cost_model *m, const hp_cost_hardware *hw)
{
    m->hw = hw;
    m->gemm_flops = hw->flops;
    m->gemm_eff = hw->gemm_eff, m->link_eff = hw->link_eff;
    m->mem_bw = hw->hbm_bw;
    m->bw_intra = hw->bw_intra, m->bw_inter = hw->bw_inter;
    m->lat_intra = hw->lat_intra, m->lat_inter = hw->lat_inter;
    m->ranks_per_node = hw->ranks_per_node;
    m->recompute = hw->gpu ? HP_COST_RECOMPUTE_SELECTIVE : HP_COST_RECOMPUTE_NONE;
    /* A GPU process never gets its whole memory: the CUDA context and the libraries' workspaces (about 1 GiB), NCCL's
     * buffers (a few MiB per channel and peer of every communicator: tp, dp, cp, ep) and the caching allocator's
     * fragmentation (blocks reserved but not allocated, typically several % of the peak) come first. A tenth of
     * the device (8 GiB of an H100) is the reserve assumed; --mem-reserve states another. */
    m->mem_reserve = hw->gpu ? hw->mem_bytes / 10 : 0;
    if (hw->gpu) m->state = HP_COST_STATE_MEGATRON;
}

const char *hp_cost_recompute_name(hp_cost_recompute r)
{
    return r == HP_COST_RECOMPUTE_FULL ? "full" : r == HP_COST_RECOMPUTE_SELECTIVE ? "selective" : "none";
}
