/*
 * gpusim's libnvidia-ml.so.1: the NVML entry points that gpuops.nvidia calls, answered from
 * the simulated host's state so the real nvidia-ml-py bindings run end to end.
 *
 * State: ROOT/var/lib/gpusim/state.nvml and procs/<pid>.nvml, flat twins of the JSON files
 * that gpusim writes together with them (gpusim/state.py, flat_text). Memory is computed as
 * the fake nvidia-smi does (gpusim/state.py, gpu_usage): live holders (checked in /proc,
 * with their start time) + dead ones inside the release delay + leaked ones until a reset
 * + stuck memory + the idle reading. Faults: lost GPUs, hang, N/A fields (as NVML return
 * codes), driver not loaded, version mismatch, no devices, row remapping and page retirement.
 *
 * PCIe: each GPU's link ("link" lines: `gpusim fault slow`) runs at its loaded gen and width while
 * the fake libcuda's copies keep it loaded (ROOT/var/lib/gpusim/link/<index> says until when), at
 * gen 1 and the same width otherwise; its replay counter is what those copies added
 * (<index>.replays). Topology: GPUs 2k and 2k+1 share a PCIe switch, the lower half of the GPUs
 * sits on NUMA node 0 and the rest on node 1 (gpusim/state.py, topology).
 *
 * NVLink (`gpusim nvlink --links N`): each GPU's links are up but those `fault slow --nvlink-down`
 * took down; the flit CRC counter of its link 0 is what the fake libcuda's peer copies over NVLink added
 * (<index>.nvlink_crc_flit), every other counter 0. The row remapper's histogram is a healthy H200's
 * unless `fault remap --histogram` says otherwise.
 *
 * Memory as real drivers report it: v1 nvmlDeviceGetMemoryInfo's `used` is reserved plus
 * allocated (NVML docs: "Sum of Reserved and Allocated"; real-samples Q09: idle GPUs read
 * hundreds of MiB); v2's `used` is allocated only, as nvidia-smi's memory.used, with
 * `reserved` beside it. In both, free = total - reserved - allocated.
 *
 * Older drivers' libraries (built with -D): GPUSIM_NO_MEMORY_V2 leaves out
 * nvmlDeviceGetMemoryInfo_v2, GPUSIM_NO_PROCESSES_V3 / _V2 the versioned process calls; the
 * symbol is then missing, as pynvml meets it on such a host (dlsym fails).
 *
 * ROOT: $GPUSIM_ROOT, else the directory above the one this library lies in, else "/".
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 nvml.c (gpusim/nvml_build.py does it).
 */
#include "../libsim/sim.h"

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_RESET_REQUIRED 16
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

/* A device handle points at one of these: a GPU's index and, for a MIG device, 1 + its MIG
 * device index (0: the GPU itself). Calls on a MIG handle answer for its parent GPU unless
 * they say otherwise. */
struct nvmlDevice_st { unsigned index; int mig; };
typedef struct nvmlDevice_st *nvmlDevice_t;
static struct nvmlDevice_st handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG];

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
/* nvmlGpuTopologyLevel_t, as nvml.h numbers it. */
typedef enum {
    NVML_TOPOLOGY_INTERNAL = 0,     /* the same board (and, here, the same GPU) */
    NVML_TOPOLOGY_SINGLE = 10,      /* a single PCIe switch */
    NVML_TOPOLOGY_MULTIPLE = 20,    /* several switches, no host bridge */
    NVML_TOPOLOGY_HOSTBRIDGE = 30,  /* one host bridge */
    NVML_TOPOLOGY_NODE = 40,        /* the host bridges of one NUMA node */
    NVML_TOPOLOGY_SYSTEM = 50       /* across NUMA nodes */
} nvmlGpuTopologyLevel_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
} nvmlProcessInfo_t;
/* What the unversioned nvmlDeviceGetComputeRunningProcesses fills (nvmlProcessInfo_v1_t). */
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
/* nvmlEnableState_t: what nvmlDeviceGetNvLinkState says of a link. */
typedef enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;
/* nvmlNvLinkErrorCounter_t, as nvml.h numbers it. */
typedef enum {
    NVML_NVLINK_ERROR_DL_REPLAY = 0,    /* data link transmit replays */
    NVML_NVLINK_ERROR_DL_RECOVERY = 1,  /* data link transmit recoveries */
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2,  /* data link receive flow control digit CRC errors */
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3,  /* data link receive data CRC errors */
    NVML_NVLINK_ERROR_DL_ECC_DATA = 4,  /* data link receive data ECC errors */
    NVML_NVLINK_ERROR_COUNT
} nvmlNvLinkErrorCounter_t;
/* nvmlRowRemapperHistogramValues_t: banks with all, many, some, few and no spare rows left. */
typedef struct { unsigned int max, high, partial, low, none; } nvmlRowRemapperHistogramValues_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static int init_count;

/* ------------------------------------------------------------------ helpers for entry points */

static nvmlReturn_t copy_string(char *out, unsigned length, const char *value)
{
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* Loads the state and finds the device's GPU; a lost GPU answers with its code. */
static nvmlReturn_t device(nvmlDevice_t dev, sim_state *st, sim_gpu **gpu, int allow_lost)
{
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st->ngpus; i++) {
        if ((unsigned)st->gpus[i].index == dev->index) {
            *gpu = &st->gpus[i];
            if (st->gpus[i].lost && !allow_lost) return st->gpus[i].lost;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

#define DEVICE(dev, allow_lost)                          \
    sim_state *st = malloc(sizeof(sim_state));           \
    sim_gpu *g = NULL;                                   \
    nvmlReturn_t rc;                                     \
    if (!st) return NVML_ERROR_UNKNOWN;                  \
    rc = device(dev, st, &g, allow_lost);                \
    if (rc != NVML_SUCCESS) { free(st); return rc; }

#define RETURN(value) do { free(st); return (value); } while (0)
#define NA(field) do { int c_ = na_code(st, field, g->index); if (c_) RETURN(c_); } while (0)

/* The MIG device a handle names, or NULL for a GPU's own handle (or a device it no longer has). */
static sim_mig *mig_of(nvmlDevice_t dev, sim_gpu *g)
{
    return dev->mig > 0 && dev->mig <= g->nmig ? &g->mig[dev->mig - 1] : NULL;
}

/* ------------------------------------------------------------------ init and system */

nvmlReturn_t nvmlInitWithFlags(unsigned flags)
{
    sim_state *st = malloc(sizeof(sim_state));
    int rc;
    (void)flags;
    if (!st) return NVML_ERROR_UNKNOWN;
    find_root();
    rc = load_state(st) ? NVML_ERROR_DRIVER_NOT_LOADED : 0;
    if (rc == 0 && st->driver_not_loaded) rc = NVML_ERROR_DRIVER_NOT_LOADED;
    if (rc == 0 && st->mismatch) rc = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    free(st);
    if (rc == 0) init_count++;
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length)
{
    sim_state st;
    int code;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    /* nvidia-smi prints the driver version per GPU; only an N/A on every GPU hides it here. */
    code = na_code(&st, "driver_version", -1);
    if (code) return code;
    return copy_string(version, length, st.driver);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length)
{
    sim_state st;
    char text[96];
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(text, sizeof text, "12.%s", st.driver);
    return copy_string(version, length, text);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length)
{
    int n;
    char path[64], buf[4096];
    FILE *f;
    size_t got;
    sim_rec *recs;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    recs = load_records(&n);
    for (int i = 0; recs && i < n; i++) {
        if (recs[i].pid == (long)pid && recs[i].alive) {
            snprintf(buf, sizeof buf, "%s", recs[i].name);
            free(recs);
            return copy_string(name, length, buf);
        }
    }
    free(recs);
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    if (!got) return NVML_ERROR_NOT_FOUND;
    return copy_string(name, length, buf);
}

/* ------------------------------------------------------------------ devices */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st.hang > 0) {
        /* A driver call stuck on a sick GPU: the caller has to give up on it. */
        struct timespec ts = { (time_t)st.hang, (long)((st.hang - (time_t)st.hang) * 1e9) };
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
    }
    *count = st.no_devices ? 0 : (unsigned)st.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st.no_devices || index >= (unsigned)st.ngpus || index >= MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    handles[index].index = index;
    *dev = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t *dev)
{
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st.ngpus; i++)
        if (strcmp(st.gpus[i].uuid, uuid) == 0)
            return nvmlDeviceGetHandleByIndex_v2((unsigned)st.gpus[i].index, dev);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st.ngpus; i++)
        if (strcasecmp(st.gpus[i].bus_id, bus_id) == 0 || strcasecmp(st.gpus[i].bus_id + 4, bus_id) == 0)
            return nvmlDeviceGetHandleByIndex_v2((unsigned)st.gpus[i].index, dev);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned *index)
{
    DEVICE(dev, 1);
    if (!index) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)g->index;
    RETURN(NVML_SUCCESS);
}

/* The minor number comes from the kernel driver's own record of the device, so it is taken to
   answer for a lost GPU too (a guess: no public report of this call on a lost GPU was found). */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned *minor)
{
    DEVICE(dev, 1);
    if (!minor) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minor = (unsigned)(g->has_minor ? g->minor : g->index);
    RETURN(NVML_SUCCESS);
}

/* The driver keeps a lost GPU's PCI location: the one query that still answers. */
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    unsigned domain = 0, bus = 0, slot = 0, fn = 0;
    DEVICE(dev, 1);
    if (!pci) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->lost) NA("pci.bus_id");
    memset(pci, 0, sizeof *pci);
    sscanf(g->bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = 0x233510DE;
    pci->pciSubSystemId = 0x18BE10DE;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, slot, fn);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned length)
{
    char mig_name[160];
    DEVICE(dev, 0);
    NA("name");
    if (mig_of(dev, g)) {
        snprintf(mig_name, sizeof mig_name, "%s MIG %s", g->name, mig_of(dev, g)->profile);
        RETURN(copy_string(name, length, mig_name));
    }
    RETURN(copy_string(name, length, g->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned length)
{
    DEVICE(dev, 0);
    NA("uuid");
    RETURN(copy_string(uuid, length, mig_of(dev, g) ? mig_of(dev, g)->uuid : g->uuid));
}

/* MiB held by live processes on GPU instance gi of GPU index. */
static long long mig_used(int index, int gi)
{
    int n;
    long long used = 0;
    sim_rec *recs = load_records(&n);
    for (int i = 0; recs && i < n; i++)
        if (holds(&recs[i], index) && recs[i].mig_gi == gi) used += recs[i].mib;
    free(recs);
    return used;
}

/* Total, reserved, allocated (v2 used) and free memory of a GPU, in bytes. */
static nvmlReturn_t memory(nvmlDevice_t dev, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used, unsigned long long *free_)
{
    long long used_mib, free_mib;
    int util;
    DEVICE(dev, 0);
    /* One driver call answers all four: N/A on any of them fails the call. */
    NA("memory.total");
    NA("memory.used");
    NA("memory.free");
    NA("memory.reserved");
    if (mig_of(dev, g)) {
        /* A MIG device: its GPU instance's memory, nothing reserved apart. */
        used_mib = mig_used(g->index, mig_of(dev, g)->gi);
        *total = (unsigned long long)mig_of(dev, g)->total_mib * MIB;
        *reserved = 0;
        *used = (unsigned long long)used_mib * MIB;
        *free_ = (unsigned long long)(mig_of(dev, g)->total_mib - used_mib) * MIB;
        RETURN(NVML_SUCCESS);
    }
    usage(st, g, &used_mib, &util);
    free_mib = g->total_mib - g->reserved_mib - used_mib;
    *total = (unsigned long long)g->total_mib * MIB;
    *reserved = (unsigned long long)g->reserved_mib * MIB;
    *used = (unsigned long long)used_mib * MIB;
    *free_ = free_mib < 0 ? 0 : (unsigned long long)free_mib * MIB;
    RETURN(NVML_SUCCESS);
}

/* v1: `used` is reserved + allocated, so an idle GPU reads what the driver reserves. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    unsigned long long reserved;
    nvmlReturn_t rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    rc = memory(dev, &mem->total, &reserved, &mem->used, &mem->free);
    if (rc == NVML_SUCCESS) mem->used += reserved;
    return rc;
}

#ifndef GPUSIM_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return memory(dev, &mem->total, &mem->reserved, &mem->used, &mem->free);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *rates)
{
    long long used;
    int util;
    DEVICE(dev, 0);
    if (!rates) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("utilization.gpu");
    /* With MIG enabled the GPU as a whole has no utilisation (nvidia-smi: N/A). */
    if (g->mig_current) RETURN(NVML_ERROR_NOT_SUPPORTED);
    usage(st, g, &used, &util);
    rates->gpu = (unsigned)util;
    rates->memory = (unsigned)(util / 2 > 100 ? 100 : util / 2);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned *temp)
{
    long long used;
    int util;
    DEVICE(dev, 0);
    if (!temp) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (sensor != 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    NA("temperature.gpu");
    usage(st, g, &used, &util);
    *temp = (unsigned)(g->temperature + util / 5);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode)
{
    DEVICE(dev, 0);
    if (!mode) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("persistence_mode");
    *mode = g->persistence ? 1 : 0;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode)
{
    DEVICE(dev, 0);
    if (!mode) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("compute_mode");
    *mode = g->compute_mode;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned *corr, unsigned *unc,
                                       unsigned *pending, unsigned *failure)
{
    DEVICE(dev, 0);
    if (!corr || !unc || !pending || !failure) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("remapped_rows.pending");
    NA("remapped_rows.failure");
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    RETURN(NVML_SUCCESS);
}

/* The banks of the GPU's memory by how many spare rows they have left (Ampere and newer). A GPU whose
 * row remapper does not answer (the na fault on remapped_rows.pending or .failure, a GPU that needs a
 * reset) answers here as in nvmlDeviceGetRemappedRows. */
nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t dev, nvmlRowRemapperHistogramValues_t *values)
{
    DEVICE(dev, 0);
    if (!values) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("remapped_rows.pending");
    NA("remapped_rows.failure");
    values->max = g->remap_histogram[0];
    values->high = g->remap_histogram[1];
    values->partial = g->remap_histogram[2];
    values->low = g->remap_histogram[3];
    values->none = g->remap_histogram[4];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending)
{
    DEVICE(dev, 0);
    if (!pending) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("retired_pages.pending");
    if (g->retired_pending < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *pending = g->retired_pending;
    RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ PCIe */

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen)
{
    DEVICE(dev, 0);
    if (!gen) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("pcie.link.gen.current");
    *gen = (unsigned)link_gen_now(g);
    RETURN(NVML_SUCCESS);
}

/* An idle link keeps its width: only the generation drops. */
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *width)
{
    DEVICE(dev, 0);
    if (!width) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("pcie.link.width.current");
    *width = (unsigned)g->link_width;
    RETURN(NVML_SUCCESS);
}

/* What the GPU and its slot allow. */
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen)
{
    DEVICE(dev, 0);
    if (!gen) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("pcie.link.gen.max");
    *gen = (unsigned)g->max_gen;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *width)
{
    DEVICE(dev, 0);
    if (!width) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("pcie.link.width.max");
    *width = (unsigned)g->max_width;
    RETURN(NVML_SUCCESS);
}

/* What the GPU itself allows: gpusim's slots allow as much, so the same as the max above. */
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen)
{
    DEVICE(dev, 0);
    if (!gen) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("pcie.link.gen.gpumax");
    *gen = (unsigned)g->max_gen;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *value)
{
    DEVICE(dev, 0);
    if (!value) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *value = (unsigned)link_number(g->index, ".replays");
    RETURN(NVML_SUCCESS);
}

/* GPUs 2k and 2k+1 share a switch; the lower half of the GPUs is on NUMA node 0, the rest on 1. */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t dev1, nvmlDevice_t dev2, nvmlGpuTopologyLevel_t *path)
{
    sim_gpu *other = NULL;
    DEVICE(dev1, 0);
    if (!path || !dev2) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < st->ngpus; i++)
        if ((unsigned)st->gpus[i].index == dev2->index) other = &st->gpus[i];
    if (!other) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (other->lost) RETURN(other->lost);
    if (other->index == g->index) *path = NVML_TOPOLOGY_INTERNAL;
    else if (other->index / 2 == g->index / 2) *path = NVML_TOPOLOGY_SINGLE;
    else if ((2 * (other->index - other->index % 2) < st->ngpus) == (2 * (g->index - g->index % 2) < st->ngpus))
        *path = NVML_TOPOLOGY_NODE;  /* one NUMA node (gpusim/state.py numa_node) */
    else *path = NVML_TOPOLOGY_SYSTEM;
    RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ NVLink */

/* A link NVML knows of on this GPU: NVML_ERROR_INVALID_ARGUMENT beyond NVML_NVLINK_MAX_LINKS or the
 * GPU's own count, NVML_ERROR_NOT_SUPPORTED on a host without NVLink (as NVML documents both). */
static nvmlReturn_t nvlink_of(const sim_state *st, unsigned link)
{
    if (link >= NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (st->nvlink_links <= 0) return NVML_ERROR_NOT_SUPPORTED;
    return link < (unsigned)st->nvlink_links ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, nvmlEnableState_t *isActive)
{
    DEVICE(dev, 0);
    if (!isActive) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = nvlink_of(st, link)) != NVML_SUCCESS) RETURN(rc);
    *isActive = nvlink_up(st, g, (int)link) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    RETURN(NVML_SUCCESS);
}

/* Only the flit CRC counter of link 0 counts anything: the errors the fake libcuda's peer copies added. */
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue)
{
    DEVICE(dev, 0);
    if (!counterValue || (unsigned)counter >= NVML_NVLINK_ERROR_COUNT) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = nvlink_of(st, link)) != NVML_SUCCESS) RETURN(rc);
    *counterValue = link == 0 && counter == NVML_NVLINK_ERROR_DL_CRC_FLIT
        ? (unsigned long long)link_number(g->index, ".nvlink_crc_flit") : 0;
    RETURN(NVML_SUCCESS);
}

/* nvmlFieldValue_t, as nvml.h lays it out (and nvidia-ml-py's c_nvmlFieldValue_t). */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

/* Field values: only the GPU Recovery Action (230) is known; every other field, and that one on a
   driver before 565, answers NOT_SUPPORTED in its own nvmlReturn, as the real call does. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values)
{
    DEVICE(dev, 0);
    if (count < 0 || (count > 0 && !values)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)(now_s() * 1e6);
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        if (values[i].fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && g->recovery >= 0) {
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            values[i].value.ullVal = 0;
            values[i].value.uiVal = (unsigned)g->recovery;
            values[i].nvmlReturn = NVML_SUCCESS;
        }
    }
    RETURN(NVML_SUCCESS);
}

/* Live holders with memory on the GPU, as nvidia-smi --query-compute-apps lists them; into
 * infos (v2/v3 structs) or, for the unversioned call, v1 (pid and memory only). */
static nvmlReturn_t processes(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos,
                              nvmlProcessInfo_v1_t *v1)
{
    int n, found = 0;
    sim_rec *recs;
    int na_mem;
    DEVICE(dev, 0);
    if (!count) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    na_mem = na_code(st, "used_gpu_memory", g->index);
    recs = load_records(&n);
    for (int i = 0; recs && i < n; i++) {
        sim_rec *r = &recs[i];
        if (r->mib <= 0 || !holds(r, g->index)) continue;
        /* On a MIG device's handle, only the processes of that compute instance. */
        if (mig_of(dev, g) && (r->mig_gi != mig_of(dev, g)->gi || r->mig_ci != mig_of(dev, g)->ci)) continue;
        if (infos && (unsigned)found < *count) {
            infos[found].pid = (unsigned)r->pid;
            infos[found].usedGpuMemory = na_mem ? NOT_AVAILABLE_ULL : (unsigned long long)r->mib * MIB;
            infos[found].gpuInstanceId = r->mig_gi < 0 ? NOT_AVAILABLE_UINT : (unsigned)r->mig_gi;
            infos[found].computeInstanceId = r->mig_ci < 0 ? NOT_AVAILABLE_UINT : (unsigned)r->mig_ci;
        }
        if (v1 && (unsigned)found < *count) {
            v1[found].pid = (unsigned)r->pid;
            v1[found].usedGpuMemory = na_mem ? NOT_AVAILABLE_ULL : (unsigned long long)r->mib * MIB;
        }
        found++;
    }
    free(recs);
    if ((!infos && !v1) || (unsigned)found > *count) {
        *count = (unsigned)found;
        RETURN(found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    *count = (unsigned)found;
    RETURN(NVML_SUCCESS);
}

#ifndef GPUSIM_NO_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(dev, count, infos, NULL);
}
#endif

#ifndef GPUSIM_NO_PROCESSES_V2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(dev, count, infos, NULL);
}
#endif

/* The unversioned symbol every library keeps: the v1 struct. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned *count,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return processes(dev, count, NULL, infos);
}

/* ------------------------------------------------------------------ MIG */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned *current, unsigned *pending)
{
    DEVICE(dev, 0);
    if (!current || !pending) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned)g->mig_current;
    *pending = (unsigned)g->mig_pending;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned *count)
{
    DEVICE(dev, 0);
    if (!count) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = MAX_MIG;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned index, nvmlDevice_t *mig)
{
    DEVICE(dev, 0);
    if (!mig || dev->mig || index >= MAX_MIG) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_current) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (index >= (unsigned)g->nmig) RETURN(NVML_ERROR_NOT_FOUND);
    mig_handles[dev->index][index].index = dev->index;
    mig_handles[dev->index][index].mig = (int)index + 1;
    *mig = &mig_handles[dev->index][index];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned *is_mig)
{
    if (!dev || !is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = dev->mig > 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *dev)
{
    if (!mig || !dev || mig->mig <= 0 || mig->index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    handles[mig->index].index = mig->index;
    *dev = &handles[mig->index];
    return NVML_SUCCESS;
}

static nvmlReturn_t instance_id(nvmlDevice_t dev, unsigned *id, int compute)
{
    DEVICE(dev, 0);
    if (!id || !mig_of(dev, g)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *id = (unsigned)(compute ? mig_of(dev, g)->ci : mig_of(dev, g)->gi);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned *id) { return instance_id(dev, id, 0); }
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned *id) { return instance_id(dev, id, 1); }
