/*
 * gpusim's libcuda.so.1: the CUDA driver API entry points that gpuops.nvidia's allocation probe
 * calls (plugins/module_utils/_cuda.py), answered from the simulated host's state, so the probe's
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
 * - cuCtxCreate_v2: the code of `gpusim fault cuda --gpu N` (but ECC, which the read back
 *   meets); CUDA_ERROR_DEVICE_UNAVAILABLE on a Prohibited GPU, and on an Exclusive_Process GPU
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
 *
 * Build: gcc -shared -fPIC -o libcuda.so.1 cuda.c -lpthread (gpusim/nvml_build.py does it).
 */
#include "../libsim/sim.h"

#include <fcntl.h>
#include <pthread.h>

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
#define CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803
#define CUDA_ERROR_UNKNOWN 999

#define COMPUTE_MODE_PROHIBITED 2
#define COMPUTE_MODE_EXCLUSIVE_PROCESS 3
#define MAX_ALLOCS 16

static const struct { int code; const char *name, *text; } ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

struct sim_alloc { int used; unsigned pattern; };

struct sim_ctx {
    int index;                /* the GPU's index */
    int fd;                   /* its /dev/nvidiaN */
    struct sim_alloc allocs[MAX_ALLOCS];
};

static int initialized;
static __thread CUcontext current;
static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;

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
    *version = 12040;
    return CUDA_SUCCESS;
}

/* Whether CUDA_VISIBLE_DEVICES, when set, lists the GPU (by index or UUID, comma separated). */
static int visible(const sim_gpu *g)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    char list[1024], *save = NULL;
    if (!env) return 1;
    set_str(list, sizeof list, env);
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (strncmp(tok, "GPU-", 4) == 0 ? strncmp(g->uuid, tok, strlen(tok)) == 0 : atoi(tok) == g->index)
            return 1;
        if (strncmp(tok, "GPU-", 4) != 0 && (*tok < '0' || *tok > '9')) return 0;  /* CUDA stops at garbage */
    }
    return 0;
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
        if (memcmp(want, have, sizeof want) == 0 && !g->lost && visible(g)) {
            *device = g->index;
            rc = CUDA_SUCCESS;
        }
    }
    free(st);
    return rc;
}

/* ------------------------------------------------------------------ contexts */

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
    else if ((rc = gpu_of(st, device, &g)) == CUDA_SUCCESS) rc = context_error(g);
    if (rc == CUDA_SUCCESS && !(*ctx = calloc(1, sizeof(struct sim_ctx)))) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        snprintf(node, sizeof node, "%s/dev/nvidia%d", root_dir, g->has_minor ? g->minor : g->index);
        (*ctx)->index = device;
        (*ctx)->fd = open(node, O_RDWR | O_CLOEXEC);
        current = *ctx;
    }
    free(st);
    return rc;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
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

/* A device pointer names its context's slot: slot + 1 in the high bits, so 0 is never valid. */
static struct sim_alloc *alloc_of(CUdeviceptr ptr)
{
    unsigned slot = (unsigned)(ptr >> 40);
    if (!current || slot < 1 || slot > MAX_ALLOCS || !current->allocs[slot - 1].used) return NULL;
    return &current->allocs[slot - 1];
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
    current->allocs[slot].used = 1;
    current->allocs[slot].pattern = 0;
    *ptr = ((CUdeviceptr)(slot + 1)) << 40;
    record_alloc(current->index, mib);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr ptr, unsigned value, size_t count)
{
    struct sim_alloc *a = alloc_of(ptr);
    (void)count;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    a->pattern = value;
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    struct sim_alloc *a = alloc_of(src);
    sim_state *st;
    sim_gpu *g = NULL;
    CUresult rc;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!a || !dst) return CUDA_ERROR_INVALID_VALUE;
    if (!(st = malloc(sizeof(sim_state)))) return CUDA_ERROR_UNKNOWN;
    rc = gpu_of(st, current->index, &g);
    if (rc == CUDA_SUCCESS && g->cuda_error == CUDA_ERROR_ECC_UNCORRECTABLE) rc = CUDA_ERROR_ECC_UNCORRECTABLE;
    free(st);
    if (rc != CUDA_SUCCESS) return rc;
    for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy((char *)dst + i, &a->pattern, 4);
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    struct sim_alloc *a = alloc_of(ptr);
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    a->used = 0;
    if (live_allocs(current) == 0) record_free(current->index);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (live_allocs(ctx)) record_free(ctx->index);
    if (ctx->fd >= 0) close(ctx->fd);
    if (current == ctx) current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}
