/*
 * gpusim's libcuda.so.1: the CUDA driver API entry points that gpuops.nvidia's allocation probe
 * calls (plugins/module_utils/_probe/cuda.py), answered from the simulated host's state, so the probe's
 * real ctypes code runs end to end.
 *
 * Signatures, CUresult numbers and cuGetErrorName's names follow cuda.h of CUDA 12.4 (the
 * cudaError_enum; the _v2 entry points are the ones cuda.h's macros name since CUDA 3.2).
 * cuGetErrorString's texts are the driver's own.
 *
 * What a probe meets:
 * - cuInit: CUDA_ERROR_NO_DEVICE without a simulated host, with driver-not-loaded or no-devices;
 *   CUDA_ERROR_SYSTEM_DRIVER_MISMATCH with mismatch; the code of `gpusim fault cuda-init`;
 *   first a sleep of `gpusim fault cuda-hang` seconds.
 * - cuDeviceGetByPCIBusId: any spelling of the bus id (0000:18:00.0, 00000000:18:00.0);
 *   CUDA_ERROR_INVALID_DEVICE for a bus id the driver does not list, a lost GPU, or a GPU that
 *   CUDA_VISIBLE_DEVICES (indexes or UUIDs, as the real library reads it) hides.
 * - cuCtxCreate_v2: first a sleep of `gpusim fault cuda-hang --gpu N` seconds, or the signal of
 *   `gpusim fault cuda-crash --gpu N` (the process dies); the code of `gpusim fault cuda --gpu N`
 *   (but ECC, which the read back meets); CUDA_ERROR_DEVICE_UNAVAILABLE on a Prohibited GPU, and on an Exclusive_Process GPU
 *   where another live process is a compute app. It opens the GPU's /dev/nvidiaN, as the real
 *   library does, and keeps it open until cuCtxDestroy_v2.
 * - cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY when the GPU's free memory (total less reserved
 *   and used, as nvidia-smi computes it) is less than the request. The allocation becomes this
 *   process's record (procs/<pid>.json and .nvml, as a holder's), so nvidia-smi and the fake
 *   NVML list the process as a compute app on the GPU while the allocation lives. No host
 *   memory backs it: cuMemsetD32_v2 remembers the pattern and cuMemcpyDtoH_v2 gives it back.
 * - cuMemcpyDtoH_v2: CUDA_ERROR_ECC_UNCORRECTABLE with `gpusim fault cuda --code ECC_UNCORRECTABLE`.
 * - cuMemFree_v2 and cuCtxDestroy_v2 record when the allocation was freed ("freed" in the
 *   record): the memory is then released like a dead holder's, after the release delay.
 * - Kernels: cuModuleLoadData(Ex) checks the PTX's .version against this driver's ISA (8.4, CUDA
 *   12.4: CUDA_ERROR_UNSUPPORTED_PTX_VERSION above it, CUDA_ERROR_INVALID_PTX without .version,
 *   .target or an .entry), writing the JIT's error log as the real one does, and keeps the entry
 *   names; the code of `gpusim fault cuda-jit --gpu N` first. cuLaunchKernel runs the probe's own
 *   kernels by name (gpuops_fill, gpuops_check; _probe/cuda.py's PTX) on the simulated memory: no
 *   memory backs a large allocation, so the fill records the run's seed, and the bits of `gpusim
 *   fault cuda-flip` that fall in what it wrote; the check counts those (or every word, when the
 *   fill did not run with that seed) into the result words, which a small allocation (up to
 *   HOST_BACKED bytes) keeps in host memory for cuMemcpyHtoD_v2/DtoH_v2. `gpusim fault
 *   cuda-launch` makes a launch fail (1, 400, 701 at cuLaunchKernel; any other at the next
 *   cuCtxSynchronize, then at every call on the context but its destruction, as a kernel fault's
 *   sticky error does), `gpusim fault cuda-idle` makes launches succeed and run nothing.
 * - Time, for the performance probe: each copy and kernel takes the time the GPU's model gives it
 *   (`gpusim fault slow`): a copy n / min(its configured GB/s, 0.85 x what the link loaded at its
 *   gen and width carries), a kernel the bytes it sweeps / the HBM's GB/s, each times (1 + u), u
 *   uniform in [-0.02, 0.02]. The call really sleeps that long, so wall time passes as on a GPU, and
 *   adds it to its context's stream clock, which the events read: the clock counts the stream's
 *   work and never its idle time, so a host slow to make its calls (a loaded CPU) does not lengthen
 *   what the events measure, as it would not on a GPU whose stream is kept fed. Synchronous copies
 *   of up to HOST_BACKED bytes (the probe's counts) stay instant.
 * - Copies (cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 and their _Async_v2 forms) write, as they start, the
 *   time until which the GPU's PCIe link is loaded (their end + 0.5 s) to ROOT/var/lib/gpusim/link/
 *   <index>, and add `gpusim fault slow --replays N` to the replay counter in <index>.replays; the
 *   fake NVML and nvidia-smi read both. `gpusim fault slow --copy-hang S` makes each copy on the GPU
 *   sleep S seconds first (a hung DMA engine: only that GPU's probe meets it).
 * - cuMemAllocHost_v2 is plain malloc, its pages untouched (a 256 MiB buffer costs nothing until
 *   written); an async copy to or from an allocation larger than HOST_BACKED reads and writes no
 *   host bytes (no memory backs it). Events and copies know only the null stream
 *   (CUDA_ERROR_INVALID_HANDLE for another); operations are synchronous, so an event recorded is
 *   complete and cuEventSynchronize returns at once.
 * - Devices and peers: cuDeviceGetCount and cuDeviceGet number the GPUs CUDA_VISIBLE_DEVICES leaves
 *   visible, in its order (the bus order without it), as the real library does; a CUdevice is the GPU's
 *   index. cuDeviceCanAccessPeer says 1 for two GPUs linked by NVLink (`gpusim nvlink`, both with a link
 *   up) or under one PCIe switch (P2P over PCIe works there), 0 otherwise; cuCtxEnablePeerAccess (per
 *   current context) follows it. Several contexts live in one process, one current per thread.
 * - Peer copies (cuMemcpyPeer, cuMemcpyPeerAsync) between allocations of two contexts: direct when
 *   either context enabled access to the other, at the peer bandwidth (gpusim/state.py peer_gbps: over
 *   NVLink 370 GB/s x the share of the slower GPU's links up, over PCIe what the slower link carries,
 *   capped by `gpusim fault slow --p2p`); otherwise staged through host memory at what the two PCIe links
 *   carry, as the CUDA Programming Guide says of copies between devices without peer access. Each takes
 *   its time on the current context's stream (with the jitter, after the larger copy-hang of the two
 *   GPUs), loads the PCIe links it crosses (with their replays), and, over NVLink, adds each GPU's
 *   `fault slow --nvlink-errors` to the flit CRC counter of its link 0 (<index>.nvlink_crc_flit).
 *
 * Build: gcc -shared -fPIC -o libcuda.so.1 cuda.c -lpthread (gpusim/nvml_build.py does it).
 */
#include "../libsim/sim.h"

#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct sim_ctx *CUcontext;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_ECC_UNCORRECTABLE 214
#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define CUDA_ERROR_PEER_ACCESS_NOT_ENABLED 705
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803
#define CUDA_ERROR_UNKNOWN 999

#define COMPUTE_MODE_PROHIBITED 2
#define COMPUTE_MODE_EXCLUSIVE_PROCESS 3
#define MAX_ALLOCS 80
#define MAX_ENTRIES 16
#define HOST_BACKED 65536
/* The driver this library stands for: CUDA 12.4 (cuDriverGetVersion), which JITs PTX ISA 8.4. */
#define DRIVER_CUDA 12040
#define DRIVER_PTX_MAJOR 8
#define DRIVER_PTX_MINOR 4
#define MAX_EVENTS 256
#define MAX_HOST_ALLOCS 64
/* Contexts alive in the process at once (one per GPU of a host, several hosts' worth), each of which
 * may have access to all the others. */
#define MAX_CONTEXTS 64
/* cuEventCreate's flags (CUevent_flags: BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4); an
 * event made with CU_EVENT_DISABLE_TIMING cannot be timed. */
#define CU_EVENT_KNOWN_FLAGS 0x7
#define CU_EVENT_DISABLE_TIMING 0x2
/* The special stream handles of cuda.h (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD): with one stream
 * per context, all three name the null stream. */
#define CU_STREAM_PER_THREAD_HANDLE 0x2
/* A lane's GB/s by PCIe generation (after 8b/10b or 128b/130b encoding), the share of it copies
 * reach, and how long a link stays loaded after a copy: gpusim/state.py PCIE_LANE_GBPS,
 * PCIE_EFFICIENCY and LINK_LOADED_AFTER_S. */
static const double LANE_GBPS[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938};
#define PCIE_EFFICIENCY 0.85
#define LINK_LOADED_AFTER_S 0.5
/* Real copies and kernels vary by a percent or two from one run to the next. */
#define JITTER 0.02
/* A peer copy over NVLink with all of both GPUs' links up: about 370 GB/s of an H100's or H200's 450 GB/s
 * each way (gpusim/state.py NVLINK_PEER_GBPS). */
#define NVLINK_PEER_GBPS 370.0

static const struct { int code; const char *name, *text; } ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

struct sim_alloc {
    int used;
    unsigned pattern;         /* cuMemsetD32_v2's value, what cuMemcpyDtoH_v2 gives back */
    size_t size;
    unsigned char *host;      /* the bytes, for an allocation of up to HOST_BACKED */
    int filled;               /* the fill kernel ran over it ... */
    unsigned seed;            /* ... with this seed */
    int nflips;               /* flipped bits that fell in what the fill wrote: their byte offsets */
    long long flips[MAX_FLIPS];
};

struct sim_ctx {
    int index;                /* the GPU's index */
    int fd;                   /* its /dev/nvidiaN */
    CUresult pending;         /* a launched kernel's fault, met by the next synchronisation ... */
    CUresult sticky;          /* ... and from then on by every call on the context */
    long long filled;         /* bytes the fill kernels wrote so far, in order (cuda-flip's offsets) */
    double stream_clock;      /* seconds of work the null stream has done: what events record */
    struct sim_ctx *peers[MAX_CONTEXTS];  /* contexts whose memory this one may access (cuCtxEnablePeerAccess) */
    struct sim_alloc allocs[MAX_ALLOCS];
};

/* An event: the stream clock when it was last recorded, on its context's null stream. */
struct sim_event {
    int used;
    unsigned flags;
    int recorded;
    struct sim_ctx *ctx;
    double clock;
};
typedef struct sim_event *CUevent;

struct sim_module { int nentries; char entries[MAX_ENTRIES][64]; };
typedef struct sim_module *CUmodule;
typedef const char *CUfunction;   /* the entry's name, inside its module */
typedef void *CUstream;

static int initialized;
static __thread CUcontext current;
static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;  /* events, page-locked memory, contexts */
static pthread_mutex_t counter_lock = PTHREAD_MUTEX_INITIALIZER;  /* the link files' counters */
static struct sim_event events[MAX_EVENTS];
static void *host_allocs[MAX_HOST_ALLOCS];
static struct sim_ctx *contexts[MAX_CONTEXTS];  /* the live contexts, so a stale or bogus handle is known */

/* This process's record: the GPUs it allocated on, and which of them it freed, when. */
static struct {
    int gpus[MAX_GPUS], ngpus;
    int freed[MAX_GPUS];
    double freed_at[MAX_GPUS];
    long long mib;
    double created;
} me;

/* ------------------------------------------------------------------ errors */

CUresult cuGetErrorName(CUresult error, const char **name)
{
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) { *name = ERRORS[i].name; return CUDA_SUCCESS; }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **text)
{
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) { *text = ERRORS[i].text; return CUDA_SUCCESS; }
    *text = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ init and devices */

CUresult cuInit(unsigned flags)
{
    sim_state *st = malloc(sizeof(sim_state));
    CUresult rc = CUDA_SUCCESS;
    if (!st) return CUDA_ERROR_UNKNOWN;
    if (flags != 0) { free(st); return CUDA_ERROR_INVALID_VALUE; }
    find_root();
    if (load_state(st) != 0) {
        free(st);
        return CUDA_ERROR_NO_DEVICE;
    }
    if (st->cuda_hang > 0) {
        struct timespec ts = {(time_t)st->cuda_hang, (long)((st->cuda_hang - (time_t)st->cuda_hang) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    if (st->cuda_init) rc = st->cuda_init;
    else if (st->driver_not_loaded || st->no_devices || st->ngpus == 0) rc = CUDA_ERROR_NO_DEVICE;
    else if (st->mismatch) rc = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    free(st);
    if (rc == CUDA_SUCCESS) initialized = 1;
    return rc;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = DRIVER_CUDA;
    return CUDA_SUCCESS;
}

/* The GPU a CUDA_VISIBLE_DEVICES entry names (an index, or a UUID or its prefix), or NULL. */
static const sim_gpu *named(const sim_state *st, const char *entry)
{
    char *end;
    long index;
    if (strncmp(entry, "GPU-", 4) == 0) {
        for (int i = 0; i < st->ngpus; i++)
            if (strncmp(st->gpus[i].uuid, entry, strlen(entry)) == 0) return &st->gpus[i];
        return NULL;
    }
    index = strtol(entry, &end, 10);
    if (end == entry || *end != '\0') return NULL;
    for (int i = 0; i < st->ngpus; i++)
        if (st->gpus[i].index == index) return &st->gpus[i];
    return NULL;
}

/* The CUdevices (GPU indexes) CUDA numbers 0, 1, ... into ordinals, and how many: those
 * CUDA_VISIBLE_DEVICES lists, in its order, up to its first entry that names no GPU (as the real
 * library stops there); without it every GPU, in bus order. A lost GPU is left out. */
static int visible_devices(const sim_state *st, int *ordinals)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    char list[1024], *save = NULL;
    int n = 0;
    if (!env) {
        for (int i = 0; i < st->ngpus; i++)
            if (!st->gpus[i].lost) ordinals[n++] = st->gpus[i].index;
        return n;
    }
    set_str(list, sizeof list, env);
    for (char *tok = strtok_r(list, ",", &save); tok && n < MAX_GPUS; tok = strtok_r(NULL, ",", &save)) {
        const sim_gpu *g;
        while (*tok == ' ') tok++;
        tok[strcspn(tok, " ")] = '\0';
        if (!(g = named(st, tok))) break;
        if (!g->lost && !has(ordinals, n, g->index)) ordinals[n++] = g->index;
    }
    return n;
}

/* Whether the GPU is one CUDA shows this process (see visible_devices). */
static int visible(const sim_state *st, const sim_gpu *g)
{
    int ordinals[MAX_GPUS];
    return has(ordinals, visible_devices(st, ordinals), g->index);
}

static int parse_bus(const char *text, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *fn)
{
    return sscanf(text, "%x:%x:%x.%x", domain, bus, dev, fn) == 4;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *device, const char *bus_id)
{
    sim_state *st;
    unsigned want[4], have[4];
    CUresult rc = CUDA_ERROR_INVALID_DEVICE;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device || !bus_id || !parse_bus(bus_id, &want[0], &want[1], &want[2], &want[3]))
        return CUDA_ERROR_INVALID_VALUE;
    st = malloc(sizeof(sim_state));
    if (!st) return CUDA_ERROR_UNKNOWN;
    if (load_state(st) != 0) { free(st); return CUDA_ERROR_NO_DEVICE; }
    for (int i = 0; i < st->ngpus; i++) {
        sim_gpu *g = &st->gpus[i];
        if (!parse_bus(g->bus_id, &have[0], &have[1], &have[2], &have[3])) continue;
        if (memcmp(want, have, sizeof want) == 0 && !g->lost && visible(st, g)) {
            *device = g->index;
            rc = CUDA_SUCCESS;
        }
    }
    free(st);
    return rc;
}

CUresult cuDeviceGetCount(int *count)
{
    sim_state *st;
    int ordinals[MAX_GPUS];
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    *count = load_state(st) == 0 ? visible_devices(st, ordinals) : 0;
    free(st);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    sim_state *st;
    int ordinals[MAX_GPUS], n = 0;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    if (load_state(st) == 0) n = visible_devices(st, ordinals);
    free(st);
    if (ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinals[ordinal];
    return CUDA_SUCCESS;
}

/* How a direct peer copy between GPUs a and b travels (gpusim/state.py peer_path). */
enum peer_path { PEER_NONE, PEER_NVLINK, PEER_PCIE };

static enum peer_path peer_path(const sim_state *st, const sim_gpu *a, const sim_gpu *b)
{
    if (a->index == b->index) return PEER_NONE;
    if (nvlinks_active(st, a) > 0 && nvlinks_active(st, b) > 0) return PEER_NVLINK;
    return a->index / 2 == b->index / 2 ? PEER_PCIE : PEER_NONE;
}

/* The visible GPU a CUdevice names, from st, or NULL. */
static sim_gpu *visible_gpu(sim_state *st, CUdevice device)
{
    for (int i = 0; i < st->ngpus; i++)
        if (st->gpus[i].index == device) return !st->gpus[i].lost && visible(st, &st->gpus[i]) ? &st->gpus[i] : NULL;
    return NULL;
}

/* 1 for two GPUs that can reach each other's memory directly: over NVLink, or P2P under one PCIe switch. */
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    sim_state *st;
    sim_gpu *g, *peer;
    CUresult rc = CUDA_SUCCESS;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    if (load_state(st) != 0 || !(g = visible_gpu(st, dev)) || !(peer = visible_gpu(st, peerDev)))
        rc = CUDA_ERROR_INVALID_DEVICE;
    else *canAccessPeer = peer_path(st, g, peer) != PEER_NONE;
    free(st);
    return rc;
}

/* ------------------------------------------------------------------ contexts */

/* The live context a handle names, or NULL for a null, unknown or destroyed one. Called with
 * table_lock held. */
static struct sim_ctx *known_context(CUcontext ctx)
{
    for (int i = 0; ctx && i < MAX_CONTEXTS; i++)
        if (contexts[i] == ctx) return ctx;
    return NULL;
}

/* Whether another live process is a compute app on GPU index. */
static int other_compute_app(int index)
{
    int n, found = 0;
    sim_rec *recs = load_records(&n);
    for (int i = 0; recs && i < n; i++)
        if (recs[i].pid != (long)getpid() && recs[i].mib > 0 && holds(&recs[i], index)) found = 1;
    free(recs);
    return found;
}

static CUresult context_error(const sim_gpu *g)
{
    if (g->cuda_error && g->cuda_error != CUDA_ERROR_ECC_UNCORRECTABLE) return g->cuda_error;
    if (g->compute_mode == COMPUTE_MODE_PROHIBITED) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (g->compute_mode == COMPUTE_MODE_EXCLUSIVE_PROCESS && other_compute_app(g->index))
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    return CUDA_SUCCESS;
}

/* Loads the state into st and points g at GPU index; CUDA_ERROR_INVALID_DEVICE when it is gone. */
static CUresult gpu_of(sim_state *st, int index, sim_gpu **g)
{
    if (load_state(st) != 0) return CUDA_ERROR_NO_DEVICE;
    for (int i = 0; i < st->ngpus; i++)
        if (st->gpus[i].index == index) { *g = &st->gpus[i]; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* A GPU whose driver hangs or crashes the process in context creation (`gpusim fault cuda-hang
 * --gpu N`, `gpusim fault cuda-crash --gpu N`): only this GPU's probe child meets it. */
static void stall(const sim_gpu *g)
{
    if (g->cuda_hang > 0) {
        struct timespec ts = {(time_t)g->cuda_hang, (long)((g->cuda_hang - (time_t)g->cuda_hang) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    if (g->cuda_crash > 0) {
        signal(g->cuda_crash, SIG_DFL);
        raise(g->cuda_crash);
    }
}

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice device)
{
    sim_state *st = malloc(sizeof(sim_state));
    sim_gpu *g = NULL;
    char node[PATH_MAX + 32];
    CUresult rc;
    (void)flags;
    if (!st) return CUDA_ERROR_UNKNOWN;
    if (!initialized) rc = CUDA_ERROR_NOT_INITIALIZED;
    else if (!ctx) rc = CUDA_ERROR_INVALID_VALUE;
    else if ((rc = gpu_of(st, device, &g)) == CUDA_SUCCESS) {
        stall(g);
        rc = context_error(g);
    }
    if (rc == CUDA_SUCCESS && !(*ctx = calloc(1, sizeof(struct sim_ctx)))) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        int slot;
        pthread_mutex_lock(&table_lock);
        for (slot = 0; slot < MAX_CONTEXTS && contexts[slot]; slot++) {}
        if (slot < MAX_CONTEXTS) contexts[slot] = *ctx;
        pthread_mutex_unlock(&table_lock);
        if (slot == MAX_CONTEXTS) {
            free(*ctx);
            *ctx = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (rc == CUDA_SUCCESS) {
        snprintf(node, sizeof node, "%s/dev/nvidia%d", root_dir, g->has_minor ? g->minor : g->index);
        (*ctx)->index = device;
        (*ctx)->fd = open(node, O_RDWR | O_CLOEXEC);
        current = *ctx;
    }
    free(st);
    return rc;
}

/* Whether ctx was given access to peer's memory. Called with table_lock held. */
static int peer_enabled(const struct sim_ctx *ctx, const struct sim_ctx *peer)
{
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (ctx->peers[i] == peer) return 1;
    return 0;
}

/* The current context may access peerContext's memory from now on: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
 * when cuDeviceCanAccessPeer says its GPU cannot, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED the second
 * time, CUDA_ERROR_INVALID_CONTEXT without a current context, for an unknown one or the current one
 * itself, CUDA_ERROR_INVALID_VALUE for flags other than 0 (cuda.h's documentation of the call). */
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    sim_state *st;
    sim_gpu *g = NULL, *peer = NULL;
    CUresult rc;
    int can;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&table_lock);
    rc = !known_context(peerContext) || peerContext == current ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
    pthread_mutex_unlock(&table_lock);
    if (rc != CUDA_SUCCESS) return rc;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    rc = gpu_of(st, current->index, &g);
    if (rc == CUDA_SUCCESS) rc = gpu_of(st, peerContext->index, &peer);
    can = rc == CUDA_SUCCESS && peer_path(st, g, peer) != PEER_NONE;
    free(st);
    if (rc != CUDA_SUCCESS) return rc;
    if (!can) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&table_lock);
    if (!known_context(peerContext)) rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (peer_enabled(current, peerContext)) rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    else
        for (int i = 0; i < MAX_CONTEXTS; i++)
            if (!current->peers[i]) {
                current->peers[i] = peerContext;
                break;
            }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* CUDA_ERROR_PEER_ACCESS_NOT_ENABLED when the current context has no access to peerContext. */
CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CUresult rc = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&table_lock);
    if (!known_context(peerContext)) rc = CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; rc != CUDA_ERROR_INVALID_CONTEXT && i < MAX_CONTEXTS; i++)
        if (current->peers[i] == peerContext) {
            current->peers[i] = NULL;
            rc = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    current = ctx;
    return CUDA_SUCCESS;
}

/* Waits for what was launched: a kernel's fault becomes the context's sticky error. */
static CUresult synchronize(void)
{
    if (current->pending) current->sticky = current->pending;
    return current->sticky;
}

CUresult cuCtxSynchronize(void)
{
    return current ? synchronize() : CUDA_ERROR_INVALID_CONTEXT;
}

/* ------------------------------------------------------------------ this process's record */

static void proc_text(const char *name, char *out, size_t size, int first_word)
{
    char path[64];
    size_t n = 0;
    FILE *f;
    snprintf(path, sizeof path, "/proc/self/%s", name);
    out[0] = '\0';
    if (!(f = fopen(path, "r"))) return;
    n = fread(out, 1, size - 1, f);
    fclose(f);
    out[n] = '\0';
    if (first_word) out[strnlen(out, n)] = '\0';  /* cmdline: argv[0] ends at its NUL */
    out[strcspn(out, "\n")] = '\0';
}

static long long self_starttime(void)
{
    char buf[4096], *p, *save = NULL;
    proc_text("stat", buf, sizeof buf, 0);
    p = strrchr(buf, ')');
    if (!p) return -1;
    p = strtok_r(p + 2, " ", &save);
    for (int i = 0; p; i++, p = strtok_r(NULL, " ", &save))
        if (i == 19) return atoll(p);
    return -1;
}

/* text as a JSON string body: quotes, backslashes and controls escaped. */
static void json_text(FILE *f, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20 || *c >= 0x7f) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
}

static void write_atomic(const char *path, void (*body)(FILE *, const char *, long long), const char *name,
                         long long start)
{
    char tmp[PATH_MAX + 128];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (!(f = fopen(tmp, "w"))) return;
    body(f, name, start);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

static char comm[64];

static void json_body(FILE *f, const char *name, long long start)
{
    fprintf(f, "{\"pid\": %d, \"starttime\": %lld, \"comm\": \"", (int)getpid(), start);
    json_text(f, comm);
    fprintf(f, "\", \"process_name\": \"");
    json_text(f, name);
    fprintf(f, "\", \"gpus\": [");
    for (int i = 0; i < me.ngpus; i++) fprintf(f, "%s%d", i ? ", " : "", me.gpus[i]);
    fprintf(f, "], \"gpus_open\": [], \"mib\": %lld, \"util\": 0, \"leak\": false, \"map\": false, "
               "\"persistenced\": false, \"children\": [], \"monitor_pid\": null, \"created\": %.6f, "
               "\"died_at\": null, \"cuda\": true, \"freed\": {", me.mib, me.created);
    for (int i = 0, n = 0; i < me.ngpus; i++)
        if (me.freed[i]) fprintf(f, "%s\"%d\": %.6f", n++ ? ", " : "", me.gpus[i], me.freed_at[i]);
    fprintf(f, "}}\n");
}

static void flat_body(FILE *f, const char *name, long long start)
{
    fprintf(f, "pid %d\nstarttime %lld\ncreated %.6f\nmib %lld\nutil 0\nleak 0\ndied_at -1.0\ngpus",
            (int)getpid(), start, me.created, me.mib);
    for (int i = 0; i < me.ngpus; i++) fprintf(f, " %d", me.gpus[i]);
    fprintf(f, "\nreset\nfreed");
    for (int i = 0; i < me.ngpus; i++)
        if (me.freed[i]) fprintf(f, " %d %.6f", me.gpus[i], me.freed_at[i]);
    fprintf(f, "\nname %s\n", name);
}

/* Writes the record (flat twin first, as gpusim's write_json does). Called with record_lock held. */
static void write_record(void)
{
    char path[PATH_MAX + 64], name[256];
    long long start = self_starttime();
    proc_text("comm", comm, sizeof comm, 0);
    proc_text("cmdline", name, sizeof name, 1);
    if (!name[0]) set_str(name, sizeof name, comm);
    snprintf(path, sizeof path, "%s/var/lib/gpusim/procs/%d.nvml", root_dir, (int)getpid());
    write_atomic(path, flat_body, name, start);
    snprintf(path, sizeof path, "%s/var/lib/gpusim/procs/%d.json", root_dir, (int)getpid());
    write_atomic(path, json_body, name, start);
}

static void record_alloc(int index, long long mib)
{
    int i;
    pthread_mutex_lock(&record_lock);
    for (i = 0; i < me.ngpus && me.gpus[i] != index; i++) {}
    if (i == me.ngpus && me.ngpus < MAX_GPUS) me.gpus[me.ngpus++] = index;
    if (i < me.ngpus) me.freed[i] = 0;
    if (mib > me.mib) me.mib = mib;
    if (me.created == 0) me.created = now_s();
    write_record();
    pthread_mutex_unlock(&record_lock);
}

static void record_free(int index)
{
    pthread_mutex_lock(&record_lock);
    for (int i = 0; i < me.ngpus; i++)
        if (me.gpus[i] == index && !me.freed[i]) {
            me.freed[i] = 1;
            me.freed_at[i] = now_s();
            write_record();
        }
    pthread_mutex_unlock(&record_lock);
}

/* ------------------------------------------------------------------ memory */

static int live_allocs(CUcontext ctx)
{
    int n = 0;
    for (int i = 0; i < MAX_ALLOCS; i++) n += ctx->allocs[i].used;
    return n;
}

/* MiB the context holds: what the process's record says it uses on the GPU. */
static long long live_mib(CUcontext ctx)
{
    unsigned long long bytes = 0;
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (ctx->allocs[i].used) bytes += ctx->allocs[i].size;
    return (long long)((bytes + MIB - 1) / MIB);
}

/* A device pointer names its context's slot (slot + 1 in the high bits, so 0 is never valid) and
 * an offset into it (the low 40 bits): the allocation, with *offset set, or NULL when the bytes
 * [ptr, ptr + bytes) are not all inside one. */
static struct sim_alloc *alloc_in(struct sim_ctx *ctx, CUdeviceptr ptr, size_t bytes, size_t *offset)
{
    unsigned slot = (unsigned)(ptr >> 40);
    size_t off = (size_t)(ptr & ((1ULL << 40) - 1));
    struct sim_alloc *a;
    if (!ctx || slot < 1 || slot > MAX_ALLOCS || !ctx->allocs[slot - 1].used) return NULL;
    a = &ctx->allocs[slot - 1];
    if (off > a->size || bytes > a->size - off) return NULL;
    if (offset) *offset = off;
    return a;
}

/* The same, in the current context. */
static struct sim_alloc *alloc_at(CUdeviceptr ptr, size_t bytes, size_t *offset)
{
    return alloc_in(current, ptr, bytes, offset);
}

static struct sim_alloc *alloc_of(CUdeviceptr ptr)
{
    size_t offset;
    struct sim_alloc *a = alloc_at(ptr, 0, &offset);
    return a && offset == 0 ? a : NULL;
}

/* The GPU of the current context, loaded into st: NULL when it is gone. */
static sim_gpu *current_gpu(sim_state *st)
{
    sim_gpu *g = NULL;
    return gpu_of(st, current->index, &g) == CUDA_SUCCESS ? g : NULL;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    sim_state *st;
    sim_gpu *g;
    long long used;
    int util;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    if (!(g = current_gpu(st))) { free(st); return CUDA_ERROR_INVALID_DEVICE; }
    usage(st, g, &used, &util);
    *total_bytes = (size_t)g->total_mib * MIB;
    *free_bytes = g->total_mib - g->reserved_mib - used > 0 ? (size_t)(g->total_mib - g->reserved_mib - used) * MIB : 0;
    free(st);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes)
{
    sim_state *st;
    sim_gpu *g = NULL;
    long long used, mib = (long long)((bytes + MIB - 1) / MIB);
    int util, slot;
    CUresult rc;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    for (slot = 0; slot < MAX_ALLOCS && current->allocs[slot].used; slot++) {}
    if (slot == MAX_ALLOCS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    rc = gpu_of(st, current->index, &g);
    if (rc == CUDA_SUCCESS) {
        usage(st, g, &used, &util);
        if (g->total_mib - g->reserved_mib - used < mib) rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    free(st);
    if (rc != CUDA_SUCCESS) return rc;
    memset(&current->allocs[slot], 0, sizeof current->allocs[slot]);
    if (bytes <= HOST_BACKED && !(current->allocs[slot].host = calloc(1, bytes))) return CUDA_ERROR_OUT_OF_MEMORY;
    current->allocs[slot].used = 1;
    current->allocs[slot].size = bytes;
    *ptr = ((CUdeviceptr)(slot + 1)) << 40;
    record_alloc(current->index, live_mib(current));
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr ptr, unsigned value, size_t count)
{
    struct sim_alloc *a = alloc_of(ptr);
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    a->pattern = value;
    for (size_t i = 0; a->host && i < count && i * 4 + 4 <= a->size; i++) memcpy(a->host + i * 4, &value, 4);
    return current->sticky;
}

/* ------------------------------------------------------------------ time on the GPU */

/* 1 + u, u uniform in [-JITTER, JITTER]; each thread draws from a seed of its own. */
static double jitter(void)
{
    static __thread unsigned short seed[3];
    static __thread int seeded;
    if (!seeded) {
        double now = now_s();
        seed[0] = (unsigned short)getpid();
        seed[1] = (unsigned short)syscall(SYS_gettid);
        seed[2] = (unsigned short)((now - (double)(long long)now) * 65536);
        seeded = 1;
    }
    return 1 + JITTER * (2 * erand48(seed) - 1);
}

/* Work of seconds on the current context's null stream: the call sleeps it, as a synchronous
 * operation on a GPU takes it, and the stream clock counts it for the events. */
static void run_on_stream(double seconds)
{
    sleep_s(seconds);
    current->stream_clock += seconds;
}

/* The GB/s a copy to (or from) GPU g reaches: its configured bandwidth, capped by what the link,
 * loaded at its gen and width, carries. */
static double copy_gbps(const sim_gpu *g, int to_device)
{
    int gen = g->link_gen < 1 ? 1 : g->link_gen > 5 ? 5 : g->link_gen;
    double capacity = PCIE_EFFICIENCY * LANE_GBPS[gen] * g->link_width;
    double configured = to_device ? g->h2d_gbps : g->d2h_gbps;
    return configured < capacity ? configured : capacity;
}

/* Writes text to GPU index's link file with suffix, atomically: several processes copy on
 * different GPUs at once, and the fake NVML and nvidia-smi read the files meanwhile. */
static void write_link_file(int index, const char *suffix, const char *text)
{
    char dir[PATH_MAX + 64], path[PATH_MAX + 64], tmp[PATH_MAX + 128];
    FILE *f;
    /* gpusim init makes the directory; a host made by an older gpusim has none. */
    snprintf(dir, sizeof dir, "%s/var/lib/gpusim/link", root_dir);
    mkdir(dir, 0755);
    link_path(path, sizeof path, index, suffix);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%ld", path, (int)getpid(), (long)syscall(SYS_gettid));
    if (!(f = fopen(tmp, "w"))) return;
    fputs(text, f);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

/* Adds count to the counter in GPU index's link file with suffix. */
static void add_to_counter(int index, const char *suffix, int count)
{
    char text[64];
    if (count <= 0) return;
    pthread_mutex_lock(&counter_lock);
    snprintf(text, sizeof text, "%.0f\n", link_number(index, suffix) + count);
    write_link_file(index, suffix, text);
    pthread_mutex_unlock(&counter_lock);
}

/* GPU g's PCIe link carries a copy of seconds that starts now: it is loaded until the copy's end +
 * LINK_LOADED_AFTER_S (never earlier than another copy left it), and the copy adds its replays to the
 * GPU's counter. */
static void pcie_traffic(const sim_gpu *g, double seconds)
{
    char text[64];
    double until = now_s() + seconds + LINK_LOADED_AFTER_S;
    if (until > link_number(g->index, "")) {
        snprintf(text, sizeof text, "%.6f\n", until);
        write_link_file(g->index, "", text);
    }
    add_to_counter(g->index, ".replays", g->replays);
}

/* A copy of bytes between the host and GPU g: the copy-hang fault's sleep first, then the link
 * loaded and its replays (pcie_traffic), and, when timed, its time on the stream. */
static void transfer(const sim_gpu *g, size_t bytes, int to_device, int timed)
{
    double gbps = copy_gbps(g, to_device);
    double seconds = timed && gbps > 0 ? (double)bytes / (gbps * 1e9) * jitter() : 0;
    sleep_s(g->copy_hang);
    pcie_traffic(g, seconds);
    run_on_stream(seconds);
}

/* Whether a stream handle names the null stream, the only one this library has. */
static int null_stream(CUstream stream)
{
    return (uintptr_t)stream <= CU_STREAM_PER_THREAD_HANDLE;
}

/* A copy between host memory and the allocation at ptr, to the device or from it. A synchronous one
 * of up to HOST_BACKED bytes is instant, any other takes its time; an allocation that no host memory
 * backs reads no host bytes, and gives back cuMemsetD32_v2's pattern only to a synchronous copy
 * (an async one, a performance probe's, writes nothing: its buffer may be 256 MiB never touched). */
static CUresult copy(void *host, CUdeviceptr ptr, size_t bytes, int to_device, int async, CUstream stream)
{
    size_t offset = 0;
    struct sim_alloc *a = alloc_at(ptr, bytes, &offset);
    sim_state *st;
    sim_gpu *g = NULL;
    CUresult rc;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (synchronize()) return current->sticky;
    if (!null_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    if (!a || !host) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    rc = gpu_of(st, current->index, &g);
    /* The read back meets an uncorrectable ECC error (`gpusim fault cuda --code ECC_UNCORRECTABLE`). */
    if (rc == CUDA_SUCCESS && !to_device && g->cuda_error == CUDA_ERROR_ECC_UNCORRECTABLE)
        rc = CUDA_ERROR_ECC_UNCORRECTABLE;
    if (rc == CUDA_SUCCESS) transfer(g, bytes, to_device, async || bytes > HOST_BACKED);
    free(st);
    if (rc != CUDA_SUCCESS) return rc;
    if (a->host && to_device) memcpy(a->host + offset, host, bytes);
    else if (a->host) memcpy(host, a->host + offset, bytes);
    else if (!to_device && !async)
        for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy((char *)host + i, &a->pattern, 4);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    return copy((void *)src, dst, bytes, 1, 0, NULL);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy(dst, src, bytes, 0, 0, NULL);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)
{
    return copy((void *)src, dst, bytes, 1, 1, stream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    return copy(dst, src, bytes, 0, 1, stream);
}

/* ------------------------------------------------------------------ peer copies */

/* The GB/s of a direct peer copy from GPU src to GPU dst along path (gpusim/state.py peer_gbps): over
 * NVLink NVLINK_PEER_GBPS x the share of the slower GPU's links that are up, over PCIe what the two
 * links carry out of src and into dst, the lower; capped by each GPU's `fault slow --p2p`. */
static double peer_gbps(const sim_state *st, const sim_gpu *src, const sim_gpu *dst, enum peer_path path)
{
    double gbps;
    if (path == PEER_NVLINK) {
        int links = nvlinks_active(st, src) < nvlinks_active(st, dst) ? nvlinks_active(st, src) : nvlinks_active(st, dst);
        gbps = NVLINK_PEER_GBPS * links / st->nvlink_links;
    } else {
        gbps = copy_gbps(src, 0) < copy_gbps(dst, 1) ? copy_gbps(src, 0) : copy_gbps(dst, 1);
    }
    if (src->p2p_gbps > 0 && src->p2p_gbps < gbps) gbps = src->p2p_gbps;
    if (dst->p2p_gbps > 0 && dst->p2p_gbps < gbps) gbps = dst->p2p_gbps;
    return gbps;
}

/* A copy of bytes from src (an allocation of srcCtx) to dst (of dstCtx), timed on the current context's
 * stream when asked: direct over the peer path when either context has access to the other, else
 * staged through host memory over both PCIe links; between two contexts of one GPU, a copy within its
 * memory (read and written at the HBM's bandwidth). The bytes of allocations host memory backs are
 * copied, the memset pattern of the others. */
static CUresult peer_copy(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t bytes, int timed,
                          CUstream stream)
{
    size_t dst_off = 0, src_off = 0;
    struct sim_alloc *to, *from;
    sim_state *st;
    sim_gpu *gsrc = NULL, *gdst = NULL;
    enum peer_path path = PEER_NONE;
    double gbps = 0, seconds = 0;
    CUresult rc = CUDA_SUCCESS;
    int direct;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (synchronize()) return current->sticky;
    if (!null_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&table_lock);
    if (!known_context(dstCtx) || !known_context(srcCtx)) rc = CUDA_ERROR_INVALID_CONTEXT;
    direct = rc == CUDA_SUCCESS && (peer_enabled(srcCtx, dstCtx) || peer_enabled(dstCtx, srcCtx));
    pthread_mutex_unlock(&table_lock);
    if (rc != CUDA_SUCCESS) return rc;
    to = alloc_in(dstCtx, dst, bytes, &dst_off);
    from = alloc_in(srcCtx, src, bytes, &src_off);
    if (!to || !from) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    rc = gpu_of(st, srcCtx->index, &gsrc);
    if (rc == CUDA_SUCCESS) rc = gpu_of(st, dstCtx->index, &gdst);
    /* Reading the source meets its GPU's uncorrectable ECC error, as a read back does. */
    if (rc == CUDA_SUCCESS && gsrc->cuda_error == CUDA_ERROR_ECC_UNCORRECTABLE) rc = CUDA_ERROR_ECC_UNCORRECTABLE;
    if (rc == CUDA_SUCCESS) {
        path = peer_path(st, gsrc, gdst);
        if (gsrc->index == gdst->index) gbps = gsrc->hbm_gbps / 2;
        else if (direct && path != PEER_NONE) gbps = peer_gbps(st, gsrc, gdst, path);
        else gbps = copy_gbps(gsrc, 0) < copy_gbps(gdst, 1) ? copy_gbps(gsrc, 0) : copy_gbps(gdst, 1);
        if (timed && gbps > 0) seconds = (double)bytes / (gbps * 1e9) * jitter();
        /* A hung copy engine on either GPU stalls the copy first. */
        sleep_s(gsrc->copy_hang > gdst->copy_hang ? gsrc->copy_hang : gdst->copy_hang);
        if (gsrc->index != gdst->index && direct && path == PEER_NVLINK) {
            add_to_counter(gsrc->index, ".nvlink_crc_flit", gsrc->nvlink_errors);
            add_to_counter(gdst->index, ".nvlink_crc_flit", gdst->nvlink_errors);
        } else if (gsrc->index != gdst->index) {
            pcie_traffic(gsrc, seconds);
            pcie_traffic(gdst, seconds);
        }
        run_on_stream(seconds);
    }
    free(st);
    if (rc != CUDA_SUCCESS) return rc;
    if (to->host && from->host) memmove(to->host + dst_off, from->host + src_off, bytes);
    else if (to->host)
        for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy(to->host + dst_off + i, &from->pattern, 4);
    else if (from->host && bytes >= 4) memcpy(&to->pattern, from->host + src_off, 4);
    else to->pattern = from->pattern;
    return CUDA_SUCCESS;
}

/* Synchronous: up to HOST_BACKED bytes it is instant, as the other synchronous copies are. */
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount)
{
    return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, ByteCount > HOST_BACKED, NULL);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream)
{
    return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, 1, hStream);
}

/* Page-locked host memory: a plain malloc, its pages left untouched (256 MiB cost nothing until
 * written); cuMemFreeHost takes only what this allocated. */
CUresult cuMemAllocHost_v2(void **pp, size_t bytes)
{
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_HOST_ALLOCS; i++)
        if (!host_allocs[i]) {
            if ((host_allocs[i] = malloc(bytes))) {
                *pp = host_allocs[i];
                rc = CUDA_SUCCESS;
            }
            break;
        }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

CUresult cuMemFreeHost(void *p)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; p && i < MAX_HOST_ALLOCS; i++)
        if (host_allocs[i] == p) {
            free(p);
            host_allocs[i] = NULL;
            rc = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

static void release(struct sim_alloc *a)
{
    free(a->host);
    memset(a, 0, sizeof *a);
}

CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    struct sim_alloc *a = alloc_of(ptr);
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (current->sticky) return current->sticky;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    release(a);
    if (live_allocs(current) == 0) record_free(current->index);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    struct sim_ctx *known;
    pthread_mutex_lock(&table_lock);
    known = known_context(ctx);
    pthread_mutex_unlock(&table_lock);
    /* A null handle, or one already destroyed: nothing of it is touched. */
    if (!known) return CUDA_ERROR_INVALID_CONTEXT;
    if (live_allocs(ctx)) record_free(ctx->index);
    for (int i = 0; i < MAX_ALLOCS; i++) release(&ctx->allocs[i]);
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        if (events[i].used && events[i].ctx == ctx) memset(&events[i], 0, sizeof events[i]);
    /* No context keeps access to it, and its handle is known no more. */
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (contexts[i] == ctx) contexts[i] = NULL;
        for (int j = 0; contexts[i] && j < MAX_CONTEXTS; j++)
            if (contexts[i]->peers[j] == ctx) contexts[i]->peers[j] = NULL;
    }
    pthread_mutex_unlock(&table_lock);
    if (ctx->fd >= 0) close(ctx->fd);
    if (current == ctx) current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ events */

/* The event a handle names, or NULL for a null or unknown one. */
static struct sim_event *event_of(CUevent e)
{
    uintptr_t at = (uintptr_t)e, first = (uintptr_t)events;
    if (at < first || at >= first + sizeof events || (at - first) % sizeof events[0]) return NULL;
    return e->used ? e : NULL;
}

CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!e || (flags & ~CU_EVENT_KNOWN_FLAGS)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        if (!events[i].used) {
            memset(&events[i], 0, sizeof events[i]);
            events[i].used = 1;
            events[i].flags = flags;
            events[i].ctx = current;
            *e = &events[i];
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* The event takes the stream clock: the work done on the stream before it. */
CUresult cuEventRecord(CUevent e, CUstream stream)
{
    struct sim_event *ev = event_of(e);
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (current->sticky) return current->sticky;
    if (!ev || !null_stream(stream) || ev->ctx != current) return CUDA_ERROR_INVALID_HANDLE;
    ev->clock = current->stream_clock;
    ev->recorded = 1;
    return CUDA_SUCCESS;
}

/* Operations are synchronous: what preceded the event is done. A kernel's fault is met here, as
 * at cuCtxSynchronize. */
CUresult cuEventSynchronize(CUevent e)
{
    struct sim_event *ev = event_of(e);
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    if (ev->ctx->pending) ev->ctx->sticky = ev->ctx->pending;
    return ev->ctx->sticky;
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    struct sim_event *from = event_of(start), *to = event_of(end);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!from || !to || !from->recorded || !to->recorded || from->ctx != to->ctx ||
        ((from->flags | to->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((to->clock - from->clock) * 1000.0);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e)
{
    struct sim_event *ev = event_of(e);
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&table_lock);
    memset(ev, 0, sizeof *ev);
    pthread_mutex_unlock(&table_lock);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ modules and kernels */

/* The JIT's error log, as the real one writes it, into the caller's buffer (options 5 and 6). */
static void jit_log(unsigned n, const int *options, void **values, const char *text)
{
    char *buffer = NULL;
    size_t size = 0;
    for (unsigned i = 0; options && values && i < n; i++) {
        if (options[i] == 5) buffer = values[i];
        if (options[i] == 6) size = (size_t)(uintptr_t)values[i];
    }
    if (buffer && size) snprintf(buffer, size, "%s", text);
}

/* CUDA_SUCCESS and the module's entries, or the JIT's error and its log line. */
static CUresult compile(const char *ptx, struct sim_module *m, char *log, size_t size)
{
    const char *p = strstr(ptx, ".version");
    int major, minor;
    if (!p || sscanf(p, ".version %d.%d", &major, &minor) != 2) {
        snprintf(log, size, "ptxas application ptx input, line 1; fatal   : Missing .version directive at start of file");
        return CUDA_ERROR_INVALID_PTX;
    }
    if (major > DRIVER_PTX_MAJOR || (major == DRIVER_PTX_MAJOR && minor > DRIVER_PTX_MINOR)) {
        snprintf(log, size, "ptxas application ptx input, line 1; fatal   : Unsupported .version %d.%d; current "
                 "version is '%d.%d'", major, minor, DRIVER_PTX_MAJOR, DRIVER_PTX_MINOR);
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    for (p = strstr(ptx, ".entry "); p && m->nentries < MAX_ENTRIES; p = strstr(p + 1, ".entry ")) {
        if (sscanf(p, ".entry %63[A-Za-z0-9_$]", m->entries[m->nentries]) == 1) m->nentries++;
    }
    if (!strstr(ptx, ".target") || m->nentries == 0) {
        snprintf(log, size, "ptxas application ptx input, line 1; error   : no .target directive or no .entry");
        return CUDA_ERROR_INVALID_PTX;
    }
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned n, int *options, void **values)
{
    sim_state *st;
    sim_gpu *g;
    char log[512] = "";
    CUresult rc = CUDA_SUCCESS;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    if (!(*module = calloc(1, sizeof(struct sim_module)))) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!(st = malloc(sizeof(sim_state)))) rc = CUDA_ERROR_UNKNOWN;
    else if ((g = current_gpu(st)) && g->cuda_jit) {
        rc = g->cuda_jit;
        snprintf(log, sizeof log, "ptxas application ptx input: gpusim fault cuda-jit --gpu %d", g->index);
    }
    free(st);
    if (rc == CUDA_SUCCESS) rc = compile(image, *module, log, sizeof log);
    if (rc != CUDA_SUCCESS) {
        jit_log(n, options, values, log);
        free(*module);
        *module = NULL;
    }
    return rc;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return cuModuleLoadDataEx(module, image, 0, NULL, NULL);
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!function || !module || !name) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < module->nentries; i++)
        if (strcmp(module->entries[i], name) == 0) { *function = module->entries[i]; return CUDA_SUCCESS; }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuModuleUnload(CUmodule module)
{
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!module) return CUDA_ERROR_INVALID_HANDLE;
    free(module);
    return current->sticky;
}

/* The probe's kernels' arguments: (data, words, seed, result), as _probe/cuda.py's PTX declares them. */
struct probe_args { CUdeviceptr data; unsigned long long words; unsigned seed; CUdeviceptr result; };

/* gpuops_fill: the allocation keeps the seed, and the flipped bits that fall in what it writes. */
static void fill(const sim_gpu *g, struct sim_alloc *a, size_t offset, const struct probe_args *k)
{
    long long start = current->filled, bytes = (long long)k->words * 4;
    a->filled = 1;
    a->seed = k->seed;
    a->nflips = 0;
    for (int i = 0; i < g->nflips; i++)
        if (g->flip_offset[i] >= start && g->flip_offset[i] < start + bytes && a->nflips < MAX_FLIPS)
            a->flips[a->nflips++] = (long long)offset + g->flip_offset[i] - start;
    current->filled += bytes;
}

/* gpuops_check: the words of the range that read back different (each flip a word of its own; all
 * of them when this run's fill did not write it), and the lowest of their indexes. */
static unsigned long long check(const struct sim_alloc *a, size_t offset, const struct probe_args *k,
                                unsigned long long *first)
{
    unsigned long long bad = 0;
    long long end = (long long)offset + (long long)k->words * 4;
    if (!a->filled || a->seed != k->seed) { *first = 0; return k->words; }
    for (int i = 0; i < a->nflips; i++)
        if (a->flips[i] >= (long long)offset && a->flips[i] < end) {
            unsigned long long index = (unsigned long long)(a->flips[i] - (long long)offset) / 4;
            if (index < *first) *first = index;
            bad++;
        }
    return bad;
}

/* Runs a probe kernel on the simulated memory; a kernel that strays is the GPU's illegal address. */
static CUresult run_kernel(const sim_gpu *g, const char *name, const struct probe_args *k)
{
    size_t offset = 0, at = 0;
    struct sim_alloc *a = alloc_at(k->data, (size_t)k->words * 4, &offset);
    struct sim_alloc *r = alloc_at(k->result, 32, &at);
    unsigned long long counts[4], first = ~0ULL;
    if (!a || !r || !r->host) return CUDA_ERROR_ILLEGAL_ADDRESS;
    memcpy(counts, r->host + at, sizeof counts);
    if (strcmp(name, "gpuops_fill") == 0) {
        fill(g, a, offset, k);
        counts[2] += k->words;
    } else {
        unsigned long long bad = check(a, offset, k, &first);
        counts[0] += bad;
        if (bad && first < counts[1]) counts[1] = first;
        counts[3] += k->words;
    }
    memcpy(r->host + at, counts, sizeof counts);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void **params, void **extra)
{
    sim_state *st;
    sim_gpu *g;
    struct probe_args k;
    CUresult rc = CUDA_SUCCESS;
    (void)shared; (void)stream; (void)extra;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (current->sticky) return current->sticky;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!params || (unsigned long long)gx * gy * gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(f, "gpuops_fill") != 0 && strcmp(f, "gpuops_check") != 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    if (!(g = current_gpu(st))) rc = CUDA_ERROR_INVALID_DEVICE;
    else if (g->cuda_launch == CUDA_ERROR_INVALID_VALUE || g->cuda_launch == CUDA_ERROR_INVALID_HANDLE ||
             g->cuda_launch == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) rc = g->cuda_launch;
    else if (g->cuda_launch && !current->pending) current->pending = g->cuda_launch;
    else if (!g->cuda_idle && !current->pending) {
        k.data = *(CUdeviceptr *)params[0];
        k.words = *(unsigned long long *)params[1];
        k.seed = *(unsigned *)params[2];
        k.result = *(CUdeviceptr *)params[3];
        current->pending = run_kernel(g, f, &k);
        /* The kernel sweeps its words at the HBM's bandwidth. */
        if (!current->pending && g->hbm_gbps > 0) run_on_stream((double)k.words * 4 / (g->hbm_gbps * 1e9) * jitter());
    }
    free(st);
    return rc;
}
